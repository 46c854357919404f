"""Shared plumbing for kernels: declared costs, role groups, one-round message assembly.

Every kernel module declares, next to its code, a ``cost_<kernel>(...) -> Cost`` function
giving rounds and bytes sent by each party as a formula of the sizes; tests run the kernel
and compare the communicator's measured traffic with the declaration.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import numpy as np

from .. import ring
from ..comm import NEXT, PREV, MalformedMessage
from ..party import Party
from ..shares import group_sizes

__all__ = ["Cost", "group_bounds", "Round", "run_steps", "NEXT", "PREV"]


@dataclass(frozen=True)
class Cost:
    rounds: int
    bytes_per_party: tuple[int, int, int]

    @property
    def bytes_total(self) -> int:
        return sum(self.bytes_per_party)

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.rounds + other.rounds,
                    tuple(a + b for a, b in zip(self.bytes_per_party, other.bytes_per_party)))

    @staticmethod
    def parallel(*costs: "Cost") -> "Cost":
        """Kernels run in shared rounds (:func:`lockstep`): the largest kernel's rounds,
        the sum of the bytes."""
        return Cost(max(c.rounds for c in costs),
                    tuple(sum(c.bytes_per_party[i] for c in costs) for i in range(3)))

    @staticmethod
    def uniform(rounds: int, per_party: int) -> "Cost":
        return Cost(rounds, (per_party,) * 3)

    @staticmethod
    def by_role(rounds: int, n: int, role_bytes) -> "Cost":
        """Cost of a role-rotated protocol: ``role_bytes(role, n_group)`` per group."""
        sizes = group_sizes(n)
        per = [0, 0, 0]
        for g, ng in enumerate(sizes):
            for rank in range(3):
                per[rank] += role_bytes((rank - g) % 3, ng)
        return Cost(rounds, tuple(per))




def group_bounds(n: int) -> list[slice]:
    return list(_group_bounds(n))


@functools.lru_cache(maxsize=4096)
def _group_bounds(n: int) -> tuple[slice, ...]:
    bounds, start = [], 0
    for size in group_sizes(n):
        bounds.append(slice(start, start + size))
        start += size
    return tuple(bounds)


def packed_bytes(n: int, width: int) -> int:
    return (n * width + 7) // 8


# ------------------------------------------------- values packed at public widths ----
def width_plan(widths):
    """How a group's elements are packed: one int width when all agree, else the
    :class:`ring.WidthPlan` (one tight bit string per distinct width, increasing)."""
    if np.ndim(widths) == 0:
        return int(widths)
    widths = np.asarray(widths).reshape(-1)
    if widths.size and (widths == widths[0]).all():
        return int(widths[0])
    return ring.width_plan(widths)


def pack_by_width(values: np.ndarray, plan) -> np.ndarray:
    """Pack each value at its own (public) width."""
    if isinstance(plan, int):
        return ring.pack_uint(values, plan)
    return ring.pack_var(values, plan)


def unpack_by_width(buf: np.ndarray, plan, n: int, src: tuple[Party, int]) -> np.ndarray:
    """Inverse of :func:`pack_by_width` on a message received at ``src`` = (party,
    direction): one that is not canonical (:class:`ring.NonCanonical`) is refused, naming
    its sender (:func:`malformed`)."""
    with malformed(src):
        if isinstance(plan, int):
            return ring.unpack_uint(buf, plan, n)
        return ring.unpack_var(buf, plan)


@contextlib.contextmanager
def malformed(src: tuple[Party, int]):
    """Around the unpacking of a message party ``src[0]`` received from direction
    ``src[1]``: a :class:`ring.NonCanonical` buffer raises
    :class:`~mpc3.comm.MalformedMessage` naming the sender. Honest packing zeroes every
    padding bit, so in either security mode a flipped one is refused, not ignored."""
    try:
        yield
    except ring.NonCanonical as exc:
        p, direction = src
        raise MalformedMessage(p.comm.peer(direction), p.rank, str(exc)) from None


def width_bytes(plan, n: int) -> int:
    return packed_bytes(n, plan) if isinstance(plan, int) else plan.nbytes


class Round:
    """Collects per-group messages for one exchange and hands back what arrived.

    Groups are visited in order 0, 1, 2 by every party, so the sender's append order and
    the receiver's read order agree for each directed link.
    """

    def __init__(self, party: Party) -> None:
        self.party = party
        self.out = {NEXT: [], PREV: []}
        self.expect = {NEXT: [], PREV: []}   # (group, count)

    def send(self, direction: int, *arrays: np.ndarray) -> None:
        self.out[direction].extend(arrays)

    def recv(self, direction: int, group: int, count: int) -> None:
        self.expect[direction].append((group, count))

    def run(self) -> dict[tuple[int, int], list[np.ndarray]]:
        got_next, got_prev = self.party.comm.exchange(
            to_next=self.out[NEXT] or None, to_prev=self.out[PREV] or None,
            from_next=bool(self.expect[NEXT]), from_prev=bool(self.expect[PREV]))
        result: dict[tuple[int, int], list[np.ndarray]] = {}
        for direction, got in ((NEXT, got_next), (PREV, got_prev)):
            pos = 0
            for group, count in self.expect[direction]:
                result[(direction, group)] = got[pos:pos + count]
                pos += count
            if got is not None and pos != len(got):
                from ..comm import ProtocolError
                raise ProtocolError(f"party {self.party.rank}: expected {pos} arrays from "
                                    f"{'next' if direction == NEXT else 'prev'}, got {len(got)}")
        return result


def lockstep(p: Party, *steps):
    """Kernels written as *steps* - generators that start with ``p.new_op()``, yield each
    :class:`Round` unrun and are sent back its result - run in lockstep, as one steps
    generator itself (``outs = yield from lockstep(...)`` nests): round k of every kernel
    still running goes out in ONE exchange (their arrays in argument order, so sender and
    receiver agree), then the kernels resume in argument order, so a later one may read in
    its next round a value an earlier one published after this round (a product's
    truncation hands the pair's sum to a comparison of the same product). Each kernel keeps
    its own kernel counter (saved at every yield, restored at every resume): equal PRG tags
    of two kernels never collide. Returns the kernels' return values. Cost: the largest
    rounds, the sum of the bytes (:meth:`Cost.parallel`)."""
    ctx, live, out = {}, {}, [None] * len(steps)

    def resume(i, value):
        p.kop = ctx.get(i, p.kop)
        try:
            live[i] = steps[i].send(value)
        except StopIteration as stop:
            live.pop(i, None)
            out[i] = stop.value
        ctx[i] = p.kop

    outer = p.kop
    for i in range(len(steps)):
        resume(i, None)
    while live:
        merged = Round(p)
        for i, r in sorted(live.items()):
            for direction in (NEXT, PREV):
                merged.out[direction].extend(r.out[direction])
                merged.expect[direction].extend(((i, g), c) for g, c in r.expect[direction])
        p.kop = outer
        got = yield merged
        outer = p.kop
        parts = {i: {} for i in live}
        for (direction, (i, g)), arrays in got.items():
            parts[i][(direction, g)] = arrays
        for i in sorted(live):
            resume(i, parts[i])
    p.kop = outer
    return out


def run_steps(p: Party, *steps):
    """Run steps kernels (:func:`lockstep`) to completion; their return values. A single
    kernel (every blocking kernel call) runs its own Rounds: nothing to merge or re-key."""
    single = len(steps) == 1
    gen = steps[0] if single else lockstep(p, *steps)
    outer = p.kop
    try:
        r = next(gen)
        while True:
            r = gen.send(r.run())
    except StopIteration as stop:
        p.kop = outer
        return [stop.value] if single else stop.value
