"""
Verdicts against random draws that do not turn on the luck of a few draws (issue 41).

The one rule (:func:`attrlab.attribution.verdicts.draw_until_settled`): random draws until each
judged margin spans three standard errors of the draws' mean, or is surely under the smallest
margin that counts. An evaluation's items are compared with a random order's exact expected
score where it is cheap (checked against a closed form on a model whose answer is known), and a
sign test says when there are too few items to decide.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf
from _perturbation_toys import token_reader_adapter
from scipy import stats
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from attrlab.attribution.metrics import evaluate_methods, summarise
from attrlab.attribution.metrics.faithfulness import AOPC_FRACTIONS, faithfulness_of_maps
from attrlab.attribution.metrics.leaderboard import EvalItem
from attrlab.attribution.models.text import TextClassifierAdapter
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import output_target
from attrlab.attribution.verdicts import (
    MIN_SIGN_TRIALS,
    VERDICT_REDRAWS,
    draw_until_settled,
    item_outcome,
    items_sign_test,
    settled,
    sign_test,
)
from attrlab.viz.evaluate import readable_table


class _Stream:
    """Seeded normal draws of one score, recording how many each call asked for."""

    def __init__(self, mean: float, sd: float) -> None:
        self.rng, self.mean, self.sd, self.asked = np.random.default_rng(0), mean, sd, []

    def __call__(self, count: int) -> np.ndarray:
        self.asked.append(count)
        return self.rng.normal(self.mean, self.sd, (count, 1))


def test_a_clear_margin_settles_at_the_first_draws():
    stream = _Stream(0.0, 0.1)
    drawn = draw_until_settled(stream, np.array([[5.0]]), most=100)
    assert stream.asked == [5] and drawn.shape == (5, 1)


def test_a_margin_within_the_noise_draws_doubling_up_to_the_cap():
    stream = _Stream(0.0, 1.0)
    drawn = draw_until_settled(stream, np.array([[0.2]]), most=64)
    # 0.2 never spans 3·1/√64 = 0.375: every round is drawn, doubling, the last one cut at 64
    assert stream.asked == [5, 5, 10, 20, 24] and drawn.shape == (64, 1)


def test_the_rule_stops_once_the_margin_spans_three_standard_errors():
    stream = _Stream(0.0, 1.0)
    drawn = draw_until_settled(stream, np.array([[0.5]]), most=1000)[:, 0]
    assert len(stream.asked) > 2  # 0.5 needs about (3/0.5)² = 36 draws of sd 1

    def spans(draws: np.ndarray) -> bool:
        return abs(0.5 - draws.mean()) >= 3 * draws.std(ddof=1) / math.sqrt(len(draws))

    assert spans(drawn)  # settled when it stopped
    assert not spans(drawn[: sum(stream.asked[:-1])])  # and not one round earlier


def test_every_judged_value_must_settle_and_the_draws_are_one_stream():
    stream = _Stream(0.0, 1.0)
    judged = np.array([[5.0], [0.01]])  # one clear, one never settles: the cap
    drawn = draw_until_settled(stream, judged, most=40)
    again = _Stream(0.0, 1.0)(40)
    np.testing.assert_array_equal(drawn, again)  # rounds continue the same seeded stream


@pytest.mark.parametrize(
    ("margin", "error", "expected"),
    [
        (0.31, 0.1, True),  # over 3 errors
        (0.29, 0.1, False),
        (-0.5, 0.1, True),  # either side
        (0.002, 0.002, True),  # 0.002 + 0.006 < 0.01: surely too small to count
        (0.004, 0.002, False),  # 0.004 + 0.006 = 0.01: not surely under it
        (1.0, math.nan, False),  # one draw: no error, nothing settled
    ],
)
def test_settled_written_out(margin, error, expected):
    assert settled(margin, error) is expected


def test_an_items_outcome_is_a_win_or_loss_only_when_settled():
    assert item_outcome(0.5, 0.1, 0.05, higher=True) == 1
    assert item_outcome(0.5, 0.1, 0.05, higher=False) == -1
    assert item_outcome(0.5, 0.1, 0.2, higher=True) == 0  # 0.4 < 3·0.2
    assert item_outcome(0.105, 0.1, 0.0, higher=True) == 0  # exact, but under 0.01
    assert item_outcome(0.12, 0.1, 0.0, higher=True) == 1


def test_too_few_items_to_decide_is_said_so():
    assert MIN_SIGN_TRIALS == 6  # 2·½⁵ = 0.0625 ≥ 0.05 > 2·½⁶ = 0.031
    four = sign_test("deletion_morf_auc", 4, 0)
    assert four.status == "inconclusive"
    assert "too few items to decide (need ≥ 6)" in four.reason
    six = sign_test("deletion_morf_auc", 6, 0)
    assert six.status == "pass" and six.value == pytest.approx(2 / 64)


def test_exact_margins_give_the_plain_sign_test():
    values = np.array([0.4, 0.5, 0.3, 0.6, 0.2, 0.45, 0.35, 0.105, 0.1])
    verdict, outcomes = items_sign_test("comprehensiveness", values, np.full(9, 0.1), 0.0, True)
    # eight margins of at least 0.01 over 0.1, all wins; 0.105 and 0.1 tie
    assert outcomes.tolist() == [1, 1, 1, 1, 1, 1, 1, 0, 0]
    assert verdict.status == "pass" and verdict.value == pytest.approx(2 / 2**7)
    assert "redraws" not in verdict.reason  # nothing to redraw


def _share_held(reason: str) -> float:
    return float(reason.split("holds on ")[1].split("% of")[0].removeprefix("only ")) / 100


def test_a_verdict_at_the_edge_of_the_test_is_not_given():
    # six margins of 3.2 standard errors (each decided, barely) and four ties: 6 of 6, p 0.031
    errors = np.full(10, 0.02)
    values = np.r_[np.full(6, 3.2 * 0.02), np.zeros(4)]
    verdict, outcomes = items_sign_test("sufficiency", -values, np.zeros(10), errors, False)
    assert outcomes.tolist() == [1] * 6 + [0] * 4
    assert verdict.status == "inconclusive" and "at the edge of the test" in verdict.reason
    # a redraw keeps the pass only if all six stay decided: P(N(3.2, 1) ≥ 3)⁶ = Φ(0.2)⁶ (a tie
    # turning into a win or loss, 2·Φ(−3) each, is left out of the reference)
    expected = stats.norm.cdf(0.2) ** 6
    assert _share_held(verdict.reason) == pytest.approx(expected, abs=4 / VERDICT_REDRAWS**0.5)
    # the same six margins at ten standard errors: every redraw keeps them
    clear, _ = items_sign_test("sufficiency", -values * 10 / 3.2, np.zeros(10), errors, False)
    assert clear.status == "pass" and _share_held(clear.reason) == 1.0


def test_a_sampled_methods_verdict_moves_less_with_its_draw():
    # a method whose score on each item is drawn around a true margin, rerun under five seeds:
    # how many item sets get a different verdict from one seed to another, by the plain sign
    # test over the decided items and by the rule that gives only verdicts its redraws keep
    rng = np.random.default_rng(1)
    moved = {"plain": 0, "redrawn": 0}
    for _ in range(30):
        true, errors = rng.uniform(-0.02, 0.12, 10), rng.uniform(0.005, 0.03, 10)
        plain, redrawn = set(), set()
        for seed in range(5):
            drawn = true + rng.standard_normal(10) * errors
            outcomes = [item_outcome(v, 0.0, e, True) for v, e in zip(drawn, errors, strict=True)]
            plain.add(sign_test("s", outcomes.count(1), outcomes.count(-1)).status)
            redrawn.add(items_sign_test("s", drawn, np.zeros(10), errors, True, seed)[0].status)
        moved["plain"] += len(plain) > 1
        moved["redrawn"] += len(redrawn) > 1
    assert moved["redrawn"] * 2 <= moved["plain"], moved


def _cat_reader(load_model):
    return token_reader_adapter(load_model("tiny-random-bert").tokenizer, "cat")


def _expected_random(n: int, high: float) -> tuple[float, float]:
    """
    A random order's expected comprehensiveness and sufficiency for the "cat" reader.

    p = σ(5) with "cat" present, ½ without; the first k of a random order hold "cat" with
    probability k / n, so E p(x without them) = σ(5) − (σ(5) − ½)·k/n and E p(them alone) =
    ½ + (σ(5) − ½)·k/n, averaged over the ERASER cut-offs.
    """
    ks = sorted({int(f * n) for f in AOPC_FRACTIONS} - {0}) or [1]
    share = float(np.mean([k / n for k in ks]))
    return (high - 0.5) * share, (high - 0.5) * (1 - share)


def test_the_exact_expectation_equals_the_closed_form(load_model):
    adapter = _cat_reader(load_model)
    inputs = adapter.preprocess("the cat sat on a red mat today")
    n = int((~inputs.fixed_tokens).sum())
    high = 1 / (1 + math.exp(-5))
    scores = np.zeros(len(inputs.tokens))
    scores[inputs.tokens.index("cat")] = 1.0
    scored = faithfulness_of_maps(
        adapter,
        inputs,
        {"oracle": scores},
        output_target(adapter, 0),
        random_orders=100,
        expected=True,
    )["oracle"]
    comprehensiveness, sufficiency = _expected_random(n, high)
    m = scored.metrics
    assert m["random_orders"] == 0 and m["comprehensiveness_random_se"] == 0
    assert m["comprehensiveness_random"] == pytest.approx(comprehensiveness, abs=1e-6)
    assert m["sufficiency_random"] == pytest.approx(sufficiency, abs=1e-6)
    # too few orders allowed to pay for every subset: drawn instead, near the same expectation
    drawn = faithfulness_of_maps(
        adapter,
        inputs,
        {"oracle": scores},
        output_target(adapter, 0),
        random_orders=3,
        expected=True,
    )["oracle"].metrics
    assert drawn["random_orders"] == 3
    assert drawn["comprehensiveness_random"] != pytest.approx(comprehensiveness, abs=1e-6)


def test_maps_share_one_set_of_random_orders(load_model):
    adapter = _cat_reader(load_model)
    inputs = adapter.preprocess("a cat and a dog and a bird and a fish sat on the long mat")
    oracle = np.zeros(len(inputs.tokens))
    oracle[inputs.tokens.index("cat")] = 1.0
    flat = np.linspace(0, 1, len(inputs.tokens))
    both = faithfulness_of_maps(
        adapter,
        inputs,
        {"oracle": oracle, "flat": flat},
        output_target(adapter, 0),
        random_orders=40,
        run=RunContext(),
    )
    a, b = both["oracle"].metrics, both["flat"].metrics
    assert a["random_orders"] == b["random_orders"] >= 5
    assert a["comprehensiveness_random"] == b["comprehensiveness_random"]
    # the flat map ranks "cat" nowhere in particular: its margin may not settle, so orders
    # are drawn until both settle or the cap; with the oracle alone fewer suffice
    alone = faithfulness_of_maps(
        adapter, inputs, {"oracle": oracle}, output_target(adapter, 0), random_orders=40
    )
    assert alone["oracle"].metrics["random_orders"] <= a["random_orders"]
    # judged against the same orders: one 95 % range of a random order's score for both
    for bound in ("low", "high"):
        assert a[f"comprehensiveness_random_{bound}"] == b[f"comprehensiveness_random_{bound}"]


class _BagOfWords(nn.Module):
    """Logit 0 = 3·tanh(Σ weight of each attended token / 3), logit 1 = 0; seeded weights."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.config = tf.BertConfig(max_position_embeddings=128, num_labels=2)
        self.embed = nn.Embedding(vocab, 1)
        with torch.no_grad():
            self.embed.weight.copy_(
                torch.randn(vocab, 1, generator=torch.Generator().manual_seed(0))
            )

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **_: object,
    ) -> SequenceClassifierOutput:
        embedded = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        total = (embedded[..., 0] * attention_mask).sum(1)
        logit = 3 * torch.tanh(total / 3)
        return SequenceClassifierOutput(logits=torch.stack([logit, torch.zeros_like(logit)], 1))


SENTENCES = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "we ate bread and soup",
    "rain fell on the old roof",
    "my friend reads books",
    "the sun rose over hills",
    "birds sang in the trees",
    "she painted the blue door",
    "they walked to the shop",
    "the river ran cold",
]
#: Long enough that every subset costs more than 100 orders: the reference is drawn.
FILLER = " and then the small red bus went down the long road to town"


@pytest.mark.parametrize("length", ["short", "long"])
def test_verdicts_stay_the_same_under_five_seeds(load_model, length):
    tokenizer = load_model("tiny-random-bert").tokenizer
    adapter = TextClassifierAdapter(_BagOfWords(tokenizer.vocab_size).eval(), tokenizer, "bow")
    tail = FILLER if length == "long" else ""
    items = [EvalItem(text + tail, 0, text) for text in SENTENCES]
    methods = ["occlusion", "gradient_x_input", "rise"]
    verdicts = []
    for seed in range(5):
        per_item = evaluate_methods(
            adapter,
            items,
            methods,
            {"rise": {"n_masks": 1000}},
            random_orders=100,
            settings=RunSettings(seed=seed),
        )
        summary = summarise(per_item, "text", seed)
        verdicts.append(
            {
                (row.method, score): getattr(row, f"{score}_verdict")
                for row in summary.itertuples()
                for score in ("comprehensiveness", "sufficiency")
            }
        )
    assert all(v == verdicts[0] for v in verdicts), verdicts
    assert "pass" in verdicts[0].values()  # not a set where nothing can be told
    # a short text's reference is the exact expectation, a long one's is drawn
    exact = per_item["random_orders"] == 0
    assert exact.all() if length == "short" else not exact.any()
    # the verdict is the sign test over the decided items, written out
    rows = per_item[per_item["method"] == "occlusion"]
    margin = rows["sufficiency_random"] - rows["sufficiency"]  # lower is better
    reach = np.maximum(0.01, 3 * rows["sufficiency_random_se"])
    wins, losses = int((margin >= reach).sum()), int((margin <= -reach).sum())
    p = stats.binomtest(wins, wins + losses, 0.5).pvalue if wins + losses else 1.0
    status = "inconclusive" if wins + losses < 6 or p >= 0.05 else "pass"
    assert verdicts[-1][("occlusion", "sufficiency")] == status


def test_four_images_say_too_few_items_rather_than_a_bare_inconclusive():
    # four items, each far better than its reference: no two-sided sign test can pass on four
    per_item = pd.DataFrame(
        {
            "item": [f"image {n}" for n in range(4)],
            "method": "occlusion",
            "deletion_morf_auc": 0.05,
            "deletion_random_auc": 0.3,
            "deletion_random_auc_se": 0.01,
            "insertion_morf_auc": 0.6,
            "insertion_random_auc": 0.3,
            "insertion_random_auc_se": 0.01,
            "forward_passes": 2.0,
            "seconds": 0.1,
        }
    )
    summary = summarise(per_item, "image")
    assert summary["deletion_morf_auc_verdict"].item() == "inconclusive"
    assert summary["deletion_morf_auc_untied"].item() == 4
    shown = readable_table(summary, "image")
    cells = [c for c in shown.iloc[0] if isinstance(c, str) and "of items" in c]
    assert len(cells) == 2
    assert all(
        c.startswith("too few items to decide (need ≥ 6): 100% of items, p 0.12") for c in cells
    )


def test_a_sampled_maps_own_noise_leaves_its_close_items_undecided():
    rows = {
        "item": [f"s{n}" for n in range(8)],
        "method": "rise",
        "comprehensiveness": 0.35,
        "comprehensiveness_random": 0.3,
        "comprehensiveness_random_se": 0.0,  # an exact reference
        "sufficiency": 0.1,
        "sufficiency_random": 0.3,
        "sufficiency_random_se": 0.0,
        "forward_passes": 2.0,
        "seconds": 0.1,
    }
    decided = summarise(pd.DataFrame(rows), "text")
    assert decided["comprehensiveness_untied"].item() == 8
    assert decided["comprehensiveness_verdict"].item() == "pass"
    # the same margins (0.05, 0.2) against a map whose own draw moves its score by 0.03 and 0.01:
    # 0.05 is within 3 of its errors, 0.2 is not
    noisy = summarise(
        pd.DataFrame(rows | {"comprehensiveness_map_se": 0.03, "sufficiency_map_se": 0.01}), "text"
    )
    assert noisy["comprehensiveness_untied"].item() == 0
    assert noisy["comprehensiveness_verdict"].item() == "inconclusive"
    assert noisy["sufficiency_verdict"].item() == "pass"


def test_sampled_maps_are_redrawn_within_their_standard_errors(load_model):
    tokenizer = load_model("tiny-random-bert").tokenizer
    adapter = TextClassifierAdapter(_BagOfWords(tokenizer.vocab_size).eval(), tokenizer, "bow")
    items = [EvalItem(text, 0, text) for text in SENTENCES[:3]]
    sampled = {"rise": {"n_masks": 200, "every_pattern": False}}
    per_item = evaluate_methods(adapter, items, ["occlusion", "rise"], sampled, random_orders=20)
    rise = per_item[per_item["method"] == "rise"]
    occlusion = per_item[per_item["method"] == "occlusion"]
    assert (rise["comprehensiveness_map_se"] > 0).all() and (rise["sufficiency_map_se"] > 0).all()
    assert "comprehensiveness_map_se" not in occlusion.dropna(axis=1).columns
    assert set(per_item["method"]) == {"occlusion", "rise"}  # the redrawn maps make no rows
    # RISE's exact expectation on these short sentences has no error: nothing to redraw
    exact = evaluate_methods(adapter, items, ["rise"], {}, random_orders=20)
    assert "comprehensiveness_map_se" not in exact.dropna(axis=1).columns
