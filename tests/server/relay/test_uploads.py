"""Turns to read result uploads (``server.relay.uploads``): at most ``UPLOADS`` at once, at most
``UPLOADS_PER_ADDRESS`` of them from one address, so that one address's slow bodies cannot hold every turn."""

from __future__ import annotations

import asyncio

from server.harness.peer import run_async
from server.relay.uploads import UPLOADS, UPLOADS_PER_ADDRESS, Uploads


def test_one_address_holds_at_most_its_share_of_the_turns_and_others_go_on() -> None:
    async def scenario() -> tuple[int, bool, bool, int]:
        uploads, release = Uploads(), asyncio.Event()
        holding = 0

        async def hold(address: str) -> None:
            nonlocal holding
            async with uploads.turn(address):
                holding += 1
                await release.wait()
                holding -= 1

        slow = [asyncio.create_task(hold("198.51.100.7")) for _ in range(UPLOADS_PER_ADDRESS + 3)]
        for _ in range(100):  # (bounded: each task takes its turn or queues within a few passes of the loop)
            await asyncio.sleep(0)
        held_by_one = holding
        other = asyncio.create_task(hold("203.0.113.9"))
        for _ in range(100):
            await asyncio.sleep(0)
        other_in = holding == held_by_one + 1
        crowd = [asyncio.create_task(hold(f"192.0.2.{i}")) for i in range(UPLOADS)]
        for _ in range(100):
            await asyncio.sleep(0)
        capped = holding
        release.set()
        await asyncio.gather(*slow, other, *crowd)
        return held_by_one, other_in, not uploads._by_address, capped

    held_by_one, other_in, forgotten, capped = run_async(scenario)
    assert held_by_one == UPLOADS_PER_ADDRESS, "one address took more than its share of the turns"
    assert other_in, "another address's upload waited behind one address's slow bodies"
    assert capped == UPLOADS, "more bodies were read at once than the relay allows"
    assert forgotten, "an address's gate outlived its uploads"


def test_a_read_runs_in_a_worker_thread_and_its_answer_is_taken_on_the_loop() -> None:
    async def scenario() -> tuple[str, bool]:
        uploads = Uploads()
        import threading

        loop_thread = threading.get_ident()
        answer = await uploads.read(lambda: threading.get_ident(),
                                    lambda ident: ("thread" if ident != loop_thread else "loop",
                                                   threading.get_ident() == loop_thread))
        uploads.close()
        return answer

    where, then_on_loop = run_async(scenario)
    assert where == "thread" and then_on_loop


def test_an_upload_a_merge_waits_for_takes_the_next_free_turn_before_the_others() -> None:
    """Every turn held and uploads queued: a copy a merge waits for, asking after them, goes in when the first turn
    is free; the others then go in the order they asked. One that gives up while queued takes no turn."""
    async def scenario() -> tuple[list[str], int]:
        uploads, order = Uploads(), []
        releases = {name: asyncio.Event() for name in ["holder", *(f"u{i}" for i in range(UPLOADS - 1)), "a", "b",
                                                      "gone", "copy", "c"]}

        async def upload(name: str, first: bool = False) -> None:
            async with uploads.turn(f"192.0.2.{list(releases).index(name)}", first=first):  # (one address each)
                order.append(name)
                await releases[name].wait()

        async def settle() -> None:
            for _ in range(100):  # (bounded: each task takes its turn or queues within a few passes of the loop)
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(upload(name)) for name in ["holder", *(f"u{i}" for i in range(UPLOADS - 1))]]
        await settle()
        for name, first in (("a", False), ("b", False), ("gone", False), ("copy", True), ("c", False)):
            tasks.append(asyncio.create_task(upload(name, first)))
            await settle()
        tasks[UPLOADS + 2].cancel()  # ("gone" gives up)
        await settle()
        for name in ("holder", "copy", "a", "b"):  # (each turn let go goes to the next in line)
            releases[name].set()
            await settle()
        for event in releases.values():
            event.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        turns = uploads._turns
        return order[UPLOADS:], turns.free if turns is not None else -1

    order, free = run_async(scenario)
    assert order == ["copy", "a", "b", "c"] and free == UPLOADS, (order, free)
