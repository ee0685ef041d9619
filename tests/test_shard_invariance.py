"""Whether an optimizer's update on shards is its update on the whole tensor, bit for bit
(``liver.engine.shard_invariance``: the ground a replayed update on another layout stands on)."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from liver.engine.shard_invariance import ADAMW_FORMS, invariant, report
from liver.topology import TrainConfig


class LiverAdamW(torch.optim.Optimizer):
    """LiveR's own AdamW (``reference.optim.adamw_step``, which both of its engines' CPU paths use)
    behind torch's Optimizer interface."""

    def __init__(self, params):
        super().__init__(params, {})
        self.n = 0

    @torch.no_grad()
    def step(self):
        from liver.engine.reference.optim import adamw_step
        ps = [p for g in self.param_groups for p in g["params"]]
        for p in ps:
            self.state[p].setdefault("exp_avg", torch.zeros_like(p))
            self.state[p].setdefault("exp_avg_sq", torch.zeros_like(p))
        adamw_step(ps, [p.grad for p in ps], [self.state[p]["exp_avg"] for p in ps],
                   [self.state[p]["exp_avg_sq"] for p in ps], [True] * len(ps), TrainConfig(), self.n, 1e-2, 0.5)
        self.n += 1


ELEMENTWISE = {"torch AdamW for-loop": ADAMW_FORMS["for-loop"], "torch AdamW foreach": ADAMW_FORMS["foreach"],
               "LiveR's AdamW": LiverAdamW,
               "SGD with momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, weight_decay=0.1),
               "Adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2)}


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(2, 300), cols=st.integers(1, 40), data=st.data(), name=st.sampled_from(sorted(ELEMENTWISE)))
def test_an_elementwise_fp32_update_on_any_cut_is_the_update_on_the_whole_tensor(rows, cols, data, name):
    """fp32 state, as LiveR keeps it (main weights and moments). In bf16 state the CPU's vectorised
    kernels round an element by where it falls in a vector: SGD with momentum on a (64, 33) tensor
    cut at rows 5 and 40 already differs; the probe is per optimizer, dtype and device."""
    cuts = data.draw(st.lists(st.integers(1, rows - 1), max_size=4, unique=True))
    assert invariant(ELEMENTWISE[name], (rows, cols), cuts, "cpu", torch.float32)


def test_an_update_that_reduces_over_the_tensor_is_not_and_the_probe_says_so():
    """Adafactor's row and column statistics: the negative control the probe must catch."""
    assert not invariant(lambda p: torch.optim.Adafactor(p, lr=1e-2), (64, 33), (5, 40))


def test_the_report_answers_for_each_adamw_form_and_refuses_bad_cuts():
    got = report()
    assert set(got) == {"for-loop", "foreach", "fused"} and got["for-loop"] is True and got["foreach"] is True
    assert got["fused"] in (True, False) or str(got["fused"]).startswith("not run")  # (the device's own answer)
    with pytest.raises(ValueError, match=r"cuts=\[9\]: allowed positions from 0 to 4"):
        invariant(ADAMW_FORMS["foreach"], (4, 2), [9])
