"""fairseq's prefetching thread is stopped before the interpreter tears down.

fairseq's `BufferedIterator` fills a queue of batches from a `BackgroundConsumer`, a daemon
thread. When training stops (--max-update, --max-epoch) that thread may still be building the
next batch; masked_lm's `MaskTokensDataset` makes each item in torch. A daemon thread inside
torch's C++ while the interpreter exits aborts the process after "done training": "terminate
called without an active exception", SIGABRT, exit status 134, so scripts and launchers see a
failed run. Plain fairseq (`fairseq-train --task masked_lm --arch roberta`, 2 layers of 32, 20
updates, 2026-12-03) aborted 8 times in 8; language_modeling's items, read from memory, did not.

At exit each live consumer is told to stop after the item at hand, its queue is drained (a put
blocked on a full queue then returns), and it is joined, for at most `TIMEOUT` seconds in all."""
import atexit
import queue
import threading
import time

TIMEOUT = 30.0


def stop_background_consumers(timeout: float = TIMEOUT) -> int:
    """Stop and join fairseq's live BackgroundConsumer threads; how many were stopped."""
    from fairseq.data.iterators import BackgroundConsumer
    consumers = [t for t in threading.enumerate() if isinstance(t, BackgroundConsumer) and t.is_alive()]
    deadline = time.monotonic() + timeout
    for consumer in consumers:
        consumer._max_len = 0                        # break after the next put
        while consumer.is_alive() and time.monotonic() < deadline:
            try:
                while True:
                    consumer._queue.get_nowait()
            except queue.Empty:
                pass
            consumer.join(0.01)
    return len(consumers)


def install() -> None:
    """Once per process (importing the user dir twice installs nothing more)."""
    if not getattr(install, "done", False):
        install.done = True
        atexit.register(stop_background_consumers)
