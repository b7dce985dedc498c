"""fairseq_momentum/loader_exit.py: at exit, fairseq's prefetching thread (BackgroundConsumer) is
stopped after the item at hand and joined, whether it is building an item or blocked on a full
queue; and plain fairseq's masked_lm run, which aborted at exit with SIGABRT, exits 0 with the
user dir (tests/test_fairseq_roberta.py trains through the CLI too)."""
import threading
import time

from fairseq.data.iterators import BufferedIterator

from fairseq_momentum.loader_exit import stop_background_consumers


class SlowItems:
    """An iterable whose items take `delay` seconds each, recording how many were started."""

    def __init__(self, n, delay):
        self.n, self.delay, self.started = n, delay, 0

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            self.started += 1
            time.sleep(self.delay)
            yield i


def live_consumers():
    return [t for t in threading.enumerate() if type(t).__name__ == "BackgroundConsumer" and t.is_alive()]


def test_a_consumer_building_an_item_is_stopped_and_joined():
    items = SlowItems(1000, 0.05)
    iterator = BufferedIterator(4, items)
    assert next(iterator) == 0                           # the thread is started and busy
    assert live_consumers()
    assert stop_background_consumers(timeout=10) == 1
    assert not live_consumers()
    assert items.started < 20                            # it stopped early, not at the end of the data


def test_a_consumer_blocked_on_a_full_queue_is_stopped_and_joined():
    iterator = BufferedIterator(2, SlowItems(1000, 0.0))
    assert next(iterator) == 0
    time.sleep(0.2)                                      # the queue fills; the thread waits in put()
    assert live_consumers()
    assert stop_background_consumers(timeout=10) == 1
    assert not live_consumers()
    assert stop_background_consumers(timeout=10) == 0
