"""The worker's memory of returned storages (``worker._Returned``): an output sharing storage
with an earlier output that is still alive is refused however long ago it was returned; one
whose earlier owner is gone is not (its memory was rightly handed out again); and nothing is
kept alive for the check."""

from __future__ import annotations

import gc

import torch

from attnverify import worker


def _range(t):
    return worker._storage_range(t)


def test_a_live_storage_is_remembered_and_a_dead_one_forgotten():
    seen = worker._Returned()
    kept = torch.ones(1000)
    gone = torch.ones(1000)
    seen.append([kept, gone])
    where_kept, where_gone = _range(kept), _range(gone)
    assert seen.overlaps(where_kept) and seen.overlaps(where_gone)
    assert seen.overlaps(_range(kept[500:]))  # a view of it: the same storage
    del gone
    gc.collect()
    assert not seen.overlaps(where_gone)  # freed: its address may be handed out again
    assert seen.overlaps(where_kept)
    assert not seen.overlaps(None)


def test_nothing_returned_is_kept_alive():
    seen = worker._Returned()
    t = torch.ones(1 << 16)
    probe = t.untyped_storage()._weak_ref()
    seen.append([t])
    del t
    gc.collect()
    assert torch.UntypedStorage._expired(probe)
    torch.UntypedStorage._free_weak_ref(probe)


def test_a_buffer_returned_again_far_later_is_still_caught():
    """Kept referenced (before), the outputs of the last 256 MB were all it knew: a cache of
    one output returned again after more than that many bytes of others went unseen."""
    seen = worker._Returned()
    cached = torch.zeros(8)
    seen.append([cached])
    for _ in range(300):  # 300 outputs of 1 MB each, dropped by their owner at once
        seen.append([torch.empty(1 << 18)])
    assert seen.overlaps(_range(cached))
    assert len(seen.entries) < 300  # the dead ones were pruned


def test_expired_ranges_between_do_not_hide_a_live_one():
    """Ranges of dead storages may overlap live ones and each other; the scan goes past them."""
    seen = worker._Returned()
    keep = [torch.empty(1 << 10) for _ in range(50)]
    seen.append(keep)
    for _ in range(50):
        seen.append([torch.empty(1 << 10)])  # each freed at once, its range left dead
    for t in keep:
        assert seen.overlaps(_range(t))
        assert seen.overlaps(_range(t[100:101]))
    fresh = torch.empty(1 << 10)
    assert not seen.overlaps(_range(fresh))


TRACKING = """
import gc

import torch

LIVE = []


def tracked(scores, dim=-1):
    # how many of this target's earlier outputs are alive when it is called again
    gc.collect()
    LIVE.append(sum(1 for r in OUTS if not torch.UntypedStorage._expired(r)))
    out = torch.softmax(scores, dim)
    OUTS.append(out.untyped_storage()._weak_ref())
    return out


OUTS = []
"""


def _message(op: str, n: int) -> dict:
    want = {"size": [2, 5], "dtype": "float64", "device": "cpu"}
    if op == "calls":
        return {"op": "calls", "fn": "target", "expect": [want] * n,
                "calls": [{"args": [{"$tensor": i}], "kwargs": {"dim": -1}} for i in range(n)]}
    return {"op": "vjps", "fn": "target", "expect": [want] * (2 * n),
            "calls": [{"args": [{"$tensor": i}], "kwargs": {"dim": -1}, "cotangent": n + i}
                      for i in range(n)]}


def test_a_request_of_several_calls_hands_each_output_on_before_the_next_call(tmp_path):
    """With a sink (the worker's slots), the outputs of call i are written and let go before call
    i + 1 runs: the worker holds one call's outputs at a time. Without one, every output comes
    back in the answer, as before."""
    import sys

    (tmp_path / "tracking_target.py").write_text(TRACKING)
    sys.path.insert(0, str(tmp_path))
    try:
        for op in ("calls", "vjps"):
            server = worker.Server()
            server.load({"kind": "normalizer", "target": "tracking_target:tracked",
                         "params": {}})
            module = sys.modules["tracking_target"]
            module.LIVE.clear()
            module.OUTS.clear()
            n = 4
            xs = [torch.randn(2, 5, dtype=torch.float64) for _ in range(n)]
            extra = [torch.randn(2, 5, dtype=torch.float64) for _ in range(n)] \
                if op == "vjps" else []
            got = {}
            reply, outputs = server.handle(_message(op, n), xs + extra,
                                           sink=lambda i, out, got=got: got.__setitem__(
                                               i, out.clone()))
            assert reply["ok"] and outputs == [None] * len(outputs)
            assert module.LIVE == [0] * n
            step = 2 if op == "vjps" else 1
            for i, x in enumerate(xs):
                assert torch.equal(got[step * i], torch.softmax(x, -1))
            module.LIVE.clear()
            module.OUTS.clear()
            reply, outputs = server.handle(_message(op, n), xs + extra)
            assert all(isinstance(o, torch.Tensor) for o in outputs)
            assert module.LIVE == list(range(n))  # kept for the answer: all alive
            del outputs
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("tracking_target", None)
