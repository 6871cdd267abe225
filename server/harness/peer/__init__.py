"""One Python peer of the relay (``relay_peer``: the protocol's steps, sans IO), the transports that run its steps
(``transport``: httpx.Client on a thread, httpx.AsyncClient on an event loop), what the steps come to (``outcomes``),
its hooks and retry policy (``hooks``) and the training many simulated peers share (``trainer``).
``server.harness.native_peer`` runs one in a thread; the benches step it themselves where they measure."""

from server.harness.peer.hooks import Exchange, PeerHooks, RetryPolicy
from server.harness.peer.outcomes import Fetched, PeerLog, Refused, Result, Unanswered
from server.harness.peer.relay_peer import RelayPeer, WeightsFrom
from server.harness.peer.trainer import Retention, Trainer
from server.harness.peer.transport import AsyncTransport, Pause, Request, Steps, SyncTransport, pooled, run_async

__all__ = ["AsyncTransport", "Exchange", "Fetched", "Pause", "PeerHooks", "PeerLog", "Refused", "RelayPeer",
           "Request", "Result", "Retention", "RetryPolicy", "Steps", "SyncTransport", "Trainer", "Unanswered",
           "WeightsFrom", "pooled", "run_async"]
