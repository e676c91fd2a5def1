"""lowp_jax's scoped switches (`_switches.Switch`): blocks of several threads."""

import threading

from lowp_jax import _switches


def test_blocks_of_two_threads_may_exit_in_any_order():
    """Thread A opens "a", thread B opens "b", A exits first: B's block still holds "b",
    in A's thread too (restoring A's saved default would end it early), and after both,
    the default."""
    switch = _switches.Switch("default")
    steps = [threading.Event() for _ in range(4)]
    seen = []

    def thread_a():
        with switch.setting("a"):
            steps[0].set()
            steps[1].wait()
        seen.append(("a exited", switch.value))
        steps[2].set()

    def thread_b():
        steps[0].wait()
        with switch.setting("b"):
            steps[1].set()
            steps[2].wait()
            seen.append(("b open", switch.value))

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert seen == [("a exited", "b"), ("b open", "b")]
    assert switch.value == "default"
