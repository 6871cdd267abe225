"""The relay's store: peers, leases, results, copies, the asynchronous buffer, bans, undos and counters.

``Store`` (``protocol``) is the interface every part of the relay types against, with the contract each
implementation keeps; ``Lease`` and ``StoredResult`` (``records``) are what any store hands back;
``open_store`` (``location``) opens one from a path or a URL: SQLite (``sqlite``), the embedded default, or
PostgreSQL (``postgresql``, ``postgresql://...``), a database server. Both are ``sql.store.SQLStore`` over their own
connection and tables: the parts (``sql``, a module per concept) write their SQL once, in what both databases speak,
and run the same tests (tests/server/relay/store/, the ``store`` fixture's two params).

Why the protocol is flat: the relay's parts call ``store.count(...)``, ``store.leases(...)``, ... in some
two hundred places; one flat ``Store`` keeps those calls as they are. It is still declared concept by concept
(``PeerStore``, ``LeaseStore``, ... in ``protocol``), and ``SQLStore`` owns one part object per concept over one
shared connection, handing each call to its owner, so no class is scattered over files and each file is one concept.
"""

from __future__ import annotations

from server.relay.store.concepts import LAST_SEEN_RESOLUTION
from server.relay.store.location import SCHEMES, StoreInUse, StoreUnavailable, UnsupportedStore, open_store
from server.relay.store.protocol import Store
from server.relay.store.records import AlreadyArrived, Lease, StoredResult

__all__ = ["LAST_SEEN_RESOLUTION", "SCHEMES", "AlreadyArrived", "Lease", "Store", "StoreInUse", "StoreUnavailable",
           "StoredResult", "UnsupportedStore", "open_store"]
