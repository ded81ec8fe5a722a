"""How DeepSpeed's slices of a parameter meet its end: the one rule the recorder's claims
(probes.claim_param) and its choice of ranks to run (cli.rank_kinds) share. Without torch, so
that the CLI can use it before the pinned environment runs."""
from __future__ import annotations


def own_elements(numel: int, size: int, place: int) -> int:
    """Of slice `place` (`size` elements) of a parameter of `numel` elements rounded up to a
    multiple of the group (_aligned_size, PP:1406-1411 at v0.13.4): how many are the
    parameter's own, or -1 when the slice starts past the end (0: it starts at the end). The
    rest is padding that nothing writes (_partition_param copies only the parameter's
    elements, PP:1554-1574). Where the slice starts decides what DeepSpeed does there: a
    partial slice is copied in part, and narrow() raises on a start past the end where a start
    at the end is an empty slice (issues 5642 and 6659, docs/deepspeed-builder.md)."""
    own = numel - place * size
    return min(own, size) if own >= 0 else -1
