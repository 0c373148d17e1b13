"""The worker's heartbeat: a thread with its own PUSH socket (ZeroMQ sockets are not
thread-safe) that tells the scheduler every second that this rank is alive, even while the main
thread is deep in a long forward."""

from __future__ import annotations

import logging
import threading

import zmq

from pagedserve.shared.protocol import Heartbeat
from pagedserve.shared.transport import ResultPusher

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 1.0


class HeartbeatSender:
    """Sends `Heartbeat.from_worker(rank, last_step_id)` every `interval_s` until stopped."""

    def __init__(
        self,
        context: zmq.Context,
        result_address: str,
        rank: int,
        interval_s: float = HEARTBEAT_INTERVAL_S,
    ) -> None:
        self.rank = rank
        self.interval_s = interval_s
        self.last_step_id = -1  # written by the main thread; a stale read is harmless
        self._context = context
        self._address = result_address
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        pusher = ResultPusher(self._context, self._address)
        try:
            while not self._stop.is_set():
                pusher.send(Heartbeat.from_worker(self.rank, self.last_step_id))
                self._stop.wait(self.interval_s)
        except zmq.ZMQError as exc:  # the context was terminated under us: shutting down
            logger.debug("heartbeat thread stops: %s", exc)
        finally:
            pusher.close()
