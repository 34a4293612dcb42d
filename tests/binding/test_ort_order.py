"""Which of a new ONNX Runtime session's threads is which: the kernel hands thread ids
out in creation order, cyclically (``affinity.binding.ort.creation_order``)."""

from __future__ import annotations

from affinity.binding.ort import creation_order


def test_creation_order_is_increasing_ids_unless_they_wrapped():
    assert creation_order([305, 301, 303]) == [301, 303, 305]
    # ids wrapped past pid_max while the pool was made: the ones before the wrap come first
    assert creation_order([4194302, 301, 4194303, 300], pid_max=4194304) == [4194302, 4194303, 300, 301]
    assert creation_order([7]) == [7] and creation_order([]) == []
