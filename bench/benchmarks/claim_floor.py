"""The floor under a claim: what read + claim would cost if the claim did nothing but its write.

The ``claim`` benchmark compares read + claim with a bare PGMQ read + archive (issue 28's goal:
>= 0.5x at batches of 10 and 50). This one shows how much of that gap no claim can close on this
schema. Per batch size (10 and 50), interleaved, ``ctx.repeat`` times, each sample on a fresh
database with the same N queued tasks (or N messages) as ``claim``:

* bare: PGMQ ``read`` + ``archive`` (the ``claim`` benchmark's baseline);
* floor: the latest protocol's ``read``, then ONE plain UPDATE of the columns a claim changes on
  each task (status, attempts, started_at, worker), reaching each task by the same unique-key
  probe as the claim (``bench.benchmarks.claim.FLOOR_UPDATE``). No lock statement, no message
  read, no classification, no handler input, no result rows: a claim that keeps its guarantees
  (docs/claim-protocol.md) does all of this and more, so it cannot cost less;
* claim: the latest protocol's ``read`` + ``claim``, as the Worker calls them;
* HOT floor: the floor on a schema where that UPDATE can be HOT, i.e. write no index entry (the
  six ``step_tasks`` indexes on status, started_at or last_worker_id dropped, fillfactor 50;
  ``bench.benchmarks.claim.HOT_SCHEMA``): what dropping upstream's status indexes would buy.

Every figure by wall clock and by the server backend's CPU clock (messages per CPU second).
"""

from __future__ import annotations

from bench.benchmarks.claim import BATCH, BIG_BATCH, bare_sample, claim_sample
from bench.core import Context, Result
from pgflow_cli.worker.protocol import LATEST

LABELS = {
    "floor": "read + the claim's UPDATE alone (floor)",
    "claim": f"{LATEST.__name__} read + claim",
    "hot_floor": "read + the claim's UPDATE alone, HOT-capable schema (HOT floor)",
}


def run(ctx: Context) -> list[Result]:
    messages = ctx.size(2000)
    kinds = ("bare", "floor", "claim", "hot_floor")
    wall: dict[tuple[int, str], list[float]] = {(b, k): [] for b in (BATCH, BIG_BATCH) for k in kinds}
    cpu: dict[tuple[int, str], list[float]] = {(b, k): [] for b in (BATCH, BIG_BATCH) for k in kinds}
    for i in range(ctx.repeat):
        for batch in (BATCH, BIG_BATCH):
            for kind in kinds:
                sample = (bare_sample(ctx, messages, batch) if kind == "bare"
                          else claim_sample(ctx, messages, batch=batch, write=kind))
                wall[batch, kind].append(sample[0])
                cpu[batch, kind].append(sample[1])
            ctx.log(f"claim_floor {i + 1}/{ctx.repeat} batch {batch}: by backend CPU (msg/CPU s) "
                    + ", ".join(f"{kind} {cpu[batch, kind][-1]:.0f}" for kind in kinds))
    results: list[Result] = []
    for batch in (BATCH, BIG_BATCH):
        for clock, unit, data in (("wall clock", "msg/s", wall), ("backend CPU", "msg/CPU s", cpu)):
            details = {"batch": batch, "clock": "schedstat" if clock == "backend CPU" else "monotonic"}
            base = f"bare PGMQ read + archive, batch {batch} ({clock})"
            floor = f"{LABELS['floor']}, batch {batch} ({clock})"
            results += [
                Result(base, unit, data[batch, "bare"], work=messages, details=details),
                Result(floor, unit, data[batch, "floor"], work=messages, baseline=base, details=details),
                Result(f"{LABELS['claim']}, batch {batch} ({clock})", unit, data[batch, "claim"], work=messages,
                       baseline=base, details={**details, "goal": ">= 0.5x"}),
                Result(f"{LABELS['claim']} against the floor, batch {batch} ({clock})", unit, data[batch, "claim"],
                       work=messages, baseline=floor, details=details),
                Result(f"{LABELS['hot_floor']}, batch {batch} ({clock})", unit, data[batch, "hot_floor"],
                       work=messages, baseline=base, details=details),
            ]
    return results
