"""The order a command's process tree is killed in (`SandboxProcess.kill_tree`)."""

from __future__ import annotations

from metrale.runtime.sandbox_proc import family


def test_a_tree_lists_every_parent_before_its_children() -> None:
    # pids whose set order puts the children first (8 and 16 hash before 7): a shell killed
    # after its `sleep` would run its next command before its own SIGKILL
    parents = {7: 1, 8: 7, 16: 8, 9: 7, 3: 1}
    tree = family(7, parents)
    assert sorted(tree) == [7, 8, 9, 16]
    assert all(tree.index(parents[p]) < tree.index(p) for p in tree if p != 7)


def test_a_loop_in_the_parents_is_walked_once() -> None:
    # a pid reused between two reads of one scan: 5's parent read as 6, 6's as 5
    assert sorted(family(5, {5: 6, 6: 5, 7: 6})) == [5, 6, 7]
