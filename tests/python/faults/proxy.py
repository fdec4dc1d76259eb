"""A fault-injecting TCP proxy: one listening port per (node, listener), all served by one
asyncio loop in a background thread.

Node `i` makes every connection to another node from the source address `127.0.0.(10+i)`
(`--cluster-source-address`), so the proxy knows which node a connection comes from by its
peer IP; anything else (127.0.0.1) is a client. A network partition is a set of cut links,
each an unordered pair of node ids. Clients are never cut off: isolating a node from its
peers while clients still reach it is the interesting case (a leader on the minority side
keeps receiving produce requests).

What a cut does to a connection: it is *black-holed*, not reset. Bytes stop flowing in both
directions (the proxy stops reading from either socket, so the kernel buffers fill and the
sender blocks, as it would once the network drops its packets), and a new connection on a
cut link is accepted but not forwarded (the proxy does not even connect upstream). When the
link heals, stalled connections resume and deliver what was sent meanwhile, late and in
order, as TCP would after retransmission. Why not a reset: a reset tells both sides at once
that the peer is gone, which a real partition never does; black-holing makes the nodes rely
on their own timeouts (fetch and RPC timeouts, session expiry), which is what must be tested.
(One difference from a real network: a connect on a cut link succeeds at once instead of
timing out, so the caller's request timeout, not its connect timeout, fires.)
"""

from __future__ import annotations

import asyncio
import ipaddress
import threading
from dataclasses import dataclass

CLIENT = 0
"""Source id of connections from anything that is not a node (clients, the harness)."""

SOURCE_BASE = 10
"""Node `i` connects from 127.0.0.(SOURCE_BASE + i)."""

CHUNK_BYTES = 64 * 1024


def source_address(node_id: int) -> str:
    assert 1 <= node_id <= 200, node_id
    return f"127.0.0.{SOURCE_BASE + node_id}"


def source_of(peer_ip: str) -> int:
    """The node id a connection comes from, or CLIENT."""
    ip = ipaddress.ip_address(peer_ip.split("%")[0])
    last = int(ip) & 0xFF
    if ip.version == 4 and ip in ipaddress.ip_network("127.0.0.0/8") and last > SOURCE_BASE and int(ip) >> 8 == 0x7F0000:
        return last - SOURCE_BASE
    return CLIENT


@dataclass
class Route:
    """One proxied listener: clients connect to `public_port`, the node listens on `private_port`."""

    node_id: int
    name: str
    public_port: int
    private_port: int


class Link:
    """The state of the link between two nodes: an event set while traffic may flow."""

    def __init__(self):
        self.open = asyncio.Event()
        self.open.set()


class FaultProxy:
    """All routes of a cluster, with cut links; thread-safe control from the harness."""

    def __init__(self, routes: list[Route]):
        self.routes = routes
        self._loop = asyncio.new_event_loop()
        self._links: dict[frozenset, Link] = {}
        self._servers: dict[int, asyncio.AbstractServer] = {}  # by public port
        self._cut: set[frozenset] = set()
        self._lock = threading.Lock()
        self.connections_total = 0
        self.connections_blackholed = 0
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    # ------------------------------------------------------------------ control (any thread)

    def start(self) -> "FaultProxy":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def close():
            for server in self._servers.values():
                server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def cut(self, pairs: set[frozenset]) -> None:
        """Replaces the set of cut links (unordered node-id pairs)."""
        for pair in pairs:
            assert len(pair) == 2 and CLIENT not in pair, pair
        with self._lock:
            self._cut = set(pairs)
        self._loop.call_soon_threadsafe(self._apply_cut, set(pairs))

    def heal(self) -> None:
        self.cut(set())

    def cut_links(self) -> set[frozenset]:
        with self._lock:
            return set(self._cut)

    # ------------------------------------------------------------------ the loop's side

    def _link(self, a: int, b: int) -> Link | None:
        """The link between two nodes, or None for a client or a node talking to itself."""
        if CLIENT in (a, b) or a == b:
            return None
        key = frozenset((a, b))
        if key not in self._links:
            self._links[key] = Link()
            if key in self._cut:
                self._links[key].open.clear()
        return self._links[key]

    def _apply_cut(self, pairs: set[frozenset]) -> None:
        for key in pairs:
            self._links.setdefault(key, Link())
        for key, link in self._links.items():
            if key in pairs:
                link.open.clear()
            else:
                link.open.set()

    def set_listening(self, node_id: int, listening: bool) -> None:
        """Opens or closes the public ports of one node. A killed node's ports are closed so
        that connecting to it is refused, as without the proxy: accepting and then closing
        at once would look like a live peer that hangs up, which callers retry without
        backing off."""
        routes = [route for route in self.routes if route.node_id == node_id]
        assert routes, f"no routes for node {node_id}"
        future = asyncio.run_coroutine_threadsafe(self._set_listening(routes, listening), self._loop)
        future.result(timeout=10)

    async def _set_listening(self, routes: list[Route], listening: bool):
        for route in routes:
            server = self._servers.pop(route.public_port, None)
            if server is not None:
                server.close()
            if listening:
                self._servers[route.public_port] = await asyncio.start_server(
                    lambda r, w, route=route: self._serve(route, r, w), "127.0.0.1", route.public_port,
                    reuse_address=True,
                )

    async def _listen(self):
        await self._set_listening(self.routes, True)

    async def _serve(self, route: Route, client_reader, client_writer):
        self.connections_total += 1
        peer = client_writer.get_extra_info("peername")
        link = self._link(source_of(peer[0]), route.node_id)
        upstream_writer = None
        try:
            if link is not None and not link.open.is_set():
                self.connections_blackholed += 1
                await link.open.wait()
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", route.private_port)
            await asyncio.gather(
                self._pipe(client_reader, upstream_writer, link),
                self._pipe(upstream_reader, client_writer, link),
                return_exceptions=True,
            )
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            # A reset, a node killed, or the proxy stopping: the connection just ends.
            pass
        finally:
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    writer.close()

    @staticmethod
    async def _pipe(reader, writer, link: Link | None):
        """Copies one direction until end of stream; waits whenever the link is cut."""
        try:
            while True:
                if link is not None:
                    await link.open.wait()
                data = await reader.read(CHUNK_BYTES)
                if not data:
                    break
                if link is not None:
                    await link.open.wait()
                writer.write(data)
                await writer.drain()
        finally:
            # Either side closing ends the whole connection: the other direction's read
            # gets an error or EOF once the socket is closed.
            writer.close()
