"""A C program for the --pin-threads tests: N pthreads alive at once (a barrier),
each printing its TID and its mask, and the main thread the same about itself;
``LINE`` parses what it prints."""

from __future__ import annotations

import re

PROGRAM = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_barrier_t barrier;
static char lines[64][256];

static void describe(char *out, size_t len, const char *who, int i)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    sched_getaffinity(0, sizeof s, &s);
    int n = snprintf(out, len, "%s %d tid=%ld cpus=", who, i, (long)syscall(SYS_gettid));
    const char *sep = "";
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &s)) {
            n += snprintf(out + n, len - (size_t)n, "%s%d", sep, c);
            sep = ",";
        }
}

static void *work(void *arg)
{
    int i = (int)(long)arg;
    describe(lines[i], sizeof lines[i], "thread", i);
    pthread_barrier_wait(&barrier);  /* all alive at once: distinct TIDs */
    return NULL;
}

static void run(const char *who, int n)
{
    pthread_t t[64];
    char me[256];
    describe(me, sizeof me, who, 0);
    printf("%s\n", me);
    pthread_barrier_init(&barrier, NULL, (unsigned)n);
    for (long i = 1; i <= n; i++)
        if (pthread_create(&t[i], NULL, work, (void *)i) != 0) {
            printf("pthread_create failed\n");
            exit(3);
        }
    for (int i = 1; i <= n; i++)
        pthread_join(t[i], NULL);
    for (int i = 1; i <= n; i++)
        printf("%s %s\n", who, lines[i]);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 4;
    run("main", n);
    if (argc > 2 && !strcmp(argv[2], "fork")) {
        pid_t pid = fork();
        if (pid == 0) {
            run("child", 2);
            _exit(0);
        }
        int st;
        waitpid(pid, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
    }
    return 0;
}
"""

LINE = re.compile(r"^(main|child)(?: thread)? (\d+) tid=(\d+) cpus=([\d,]*)$")
