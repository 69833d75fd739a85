"""Activation patching and its estimators on tiny models whose answers are known."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf
from _model_state import model_state
from torch import nn

from attrlab.attribution.errors import (
    BudgetExceededError,
    InvalidInputError,
    InvalidParameterError,
    JobCancelledError,
)
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.patching import (
    COLUMNS,
    ESTIMATORS,
    GaussianNoise,
    patched_score,
    patching_problem,
    patching_report,
    planned_passes,
)
from attrlab.attribution.request.run import RunSettings

CLEAN, CORRUPTED = "then mary went home", "then john went home"
IOI = "when mary and john went to the store john gave a drink to"
IOI_SWAPPED = "when mary and john went to the store mary gave a drink to"


def _copy_head_model(tokenizer) -> DecoderLMAdapter:
    """
    One GPT-2 layer whose head 0 copies the name at position 1 to the last position.

    Names differ only on dimensions 0 and 1 (``mary`` = (2, −2), ``john`` = (−2, 2)), with equal
    means and norms, so every LayerNorm gives both the same statistics and only dimensions 0
    and 1 differ between the runs. Head 0 attends to position 1 (marked by its positional
    embedding on dimension 15) and writes that position's dimensions 0 and 1 into the
    residual; heads 1–3 read and write dimensions 4–14 only; the MLP is zero. The tied
    unembedding reads ``logit(mary) − logit(john)`` from dimensions 0 and 1.
    """
    config = tf.GPT2Config(
        vocab_size=tokenizer.vocab_size,
        n_embd=16,
        n_layer=1,
        n_head=4,
        n_positions=16,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="eager",
    )
    model = tf.GPT2LMHeadModel(config).double().eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        block = model.transformer.h[0]
        for norm in (block.ln_1, block.ln_2, model.transformer.ln_f):
            norm.weight.fill_(1.0)
        wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight
        for word in ("then", "went", "home"):
            wte[tokenizer.convert_tokens_to_ids(word), 4:15] = torch.randn(11, generator=generator)
        for word, sign in (("mary", 1.0), ("john", -1.0)):
            index = tokenizer.convert_tokens_to_ids(word)
            wte[index, :2] = torch.tensor([2.0 * sign, -2.0 * sign])
            wte[index, 5] = 1.0
        wpe[1, 15] = 4.0
        attention = block.attn
        qkv, out = attention.c_attn, attention.c_proj  # Conv1D: x @ weight, (in, out)
        qkv.bias[0] = 30.0  # head 0's query: a constant
        qkv.weight[15, 16] = 1.0  # head 0's key reads the position mark
        qkv.weight[0, 32], qkv.weight[1, 33] = 1.0, 1.0  # head 0's value: dims 0 and 1
        out.weight[0, 0], out.weight[1, 1] = 1.0, 1.0
        for head in (1, 2, 3):
            columns = slice(4 * head, 4 * head + 4)
            for block in (0, 16, 32):  # query, key, value of the head
                qkv.weight[4:15, block + 4 * head : block + 4 * head + 4] = torch.randn(
                    11, 4, generator=generator, dtype=torch.float64
                )
            out.weight[columns, 4:15] = torch.randn(4, 11, generator=generator, dtype=torch.float64)
    return DecoderLMAdapter(model, tokenizer, "toy-copy-head", add_special_tokens=False)


@pytest.fixture(scope="module")
def gpt2(load_model):
    return load_model("tiny-random-gpt2")


@pytest.fixture(scope="module")
def llama(load_model):
    return load_model("tiny-random-llama")


@pytest.fixture(scope="module")
def copy_head(gpt2):
    return _copy_head_model(gpt2.tokenizer)


def test_the_copying_head_alone_restores_the_clean_answer(copy_head):
    problem = patching_problem(copy_head, CLEAN, CORRUPTED, answer=" mary", contrast=" john")
    report = patching_report(copy_head, problem, ["exact"], ["head"], ["denoising"])
    assert report.clean_score > 0 > report.corrupted_score
    by_head = report.table.set_index("head")["normalised"]
    assert by_head[0] >= 0.9
    assert all(by_head[h] <= 0.1 for h in (1, 2, 3))
    # the same with the head's output patched position by position: only the last position
    # (where the answer is read) carries it
    each = patching_report(copy_head, problem, ["exact"], ["head_position"], ["denoising"]).table
    head0 = each[each["head"] == 0].set_index("position")["normalised"]
    read_at = len(problem.clean.token_texts) - 2  # the prompt's last token
    assert head0[read_at] >= 0.9
    assert head0.drop(read_at).abs().max() <= 0.1
    # every head's pattern is the same in both runs (keys read the position mark only), so
    # AtP*'s recomputed softmax changes nothing: its value path is AtP's (one layer: no
    # GradDrop, the magnitude |AtP|)
    estimates = patching_report(copy_head, problem, ["atp", "atp_star"], ["head"], ["denoising"])
    by_estimator = estimates.table.set_index(["estimator", "head"])["effect"]
    assert by_estimator["atp", 0] > 0
    for head in range(4):
        assert by_estimator["atp_star", head] == pytest.approx(abs(by_estimator["atp", head]))


@pytest.fixture(scope="module")
def bert(load_model):
    return load_model("tiny-random-bert")


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_a_whole_residual_stream_restores_all_and_nothing_restores_none(name, request):
    adapter = request.getfixturevalue(name)
    if name == "bert":  # a classifier: its class's logit (an encoder: every position counts)
        problem = patching_problem(adapter, "a fine film", "a poor film", target=1)
        assert problem.target.label == adapter.label(1)
    else:
        problem = patching_problem(adapter, IOI, IOI_SWAPPED, answer=" mary", contrast=" john")
    for layer in range(adapter.num_layers):
        for direction, everything in (("denoising", 1.0), ("noising", 0.0)):
            all_of_it = patched_score(adapter, problem, "residual", layer, direction=direction)
            assert all_of_it == pytest.approx(everything, abs=1e-6)
            nothing = patched_score(adapter, problem, "residual", layer, (), direction=direction)
            assert nothing == pytest.approx(1.0 - everything, abs=1e-6)


def _linear_after_last_layer(gpt2: DecoderLMAdapter) -> DecoderLMAdapter:
    """
    tiny-random-gpt2 in float64 with no final norm and a zero last MLP.

    The score is then linear in the last layer's head outputs, attention output and MLP output.
    """
    model = copy.deepcopy(gpt2.model).double()
    model.transformer.ln_f = nn.Identity()
    with torch.no_grad():
        for param in model.transformer.h[-1].mlp.parameters():
            param.zero_()
    return DecoderLMAdapter(model, gpt2.tokenizer, "linear-gpt2", add_special_tokens=False)


def test_estimators_equal_exact_patching_where_the_model_is_linear(gpt2):
    adapter = _linear_after_last_layer(gpt2)
    problem = patching_problem(adapter, IOI, IOI_SWAPPED, answer=" mary", contrast=" john")
    components = ["attention", "mlp", "head"]
    report = patching_report(adapter, problem, None, components)
    last = report.table[report.table["layer"] == adapter.num_layers - 1]
    keys = ["direction", "component", "head", "position"]
    exact = last[last["estimator"] == "exact"].set_index(keys)["effect"].sort_index()
    assert exact.abs().max() > 1e-6  # something to estimate (a random model's small effects)
    for name in ("atp", "relp"):  # first order (RelP: LRP's rules are the gradient here)
        estimate = last[last["estimator"] == name].set_index(keys)["effect"].sort_index()
        np.testing.assert_allclose(estimate.to_numpy(), exact.to_numpy(), rtol=1e-7, atol=1e-13)
    # AtP*: GradDrop's terms are |I| for every dropped layer but the site's own (0): |exact|
    star = last[last["estimator"] == "atp_star"].set_index(keys)["effect"].sort_index()
    whole = [c in ("attention", "mlp") for c in exact.index.get_level_values("component")]
    np.testing.assert_allclose(
        star[whole].to_numpy(), exact[whole].abs().to_numpy(), rtol=1e-7, atol=1e-13
    )


def test_a_forced_error_mid_patch_leaves_the_model_as_it_was(gpt2):
    problem = patching_problem(gpt2, IOI, IOI_SWAPPED, answer=" mary", contrast=" john")
    kwargs = problem.clean.model_kwargs()
    with torch.no_grad():
        before_logits = gpt2.logits(**kwargs)
    block = gpt2.blocks()[-1]
    grads = [
        p.grad for p in gpt2.model.parameters()
    ]  # the shared model's, as other tests left them
    for estimator in ESTIMATORS:
        calls = iter(range(1000))

        def fail(_m, _a, _o, calls=calls):
            if next(calls) == 2:  # the first pass after the baseline: mid-estimator
                raise RuntimeError("forced")

        handle = block.register_forward_hook(fail)
        before = model_state(gpt2.model)
        with pytest.raises(RuntimeError, match="forced"):
            patching_report(gpt2, problem, [estimator], ["head", "residual"], ["denoising"])
        assert model_state(gpt2.model) == before, estimator
        handle.remove()
    with torch.no_grad():
        torch.testing.assert_close(gpt2.logits(**kwargs), before_logits, rtol=0, atol=0)
    assert all(p.grad is g for p, g in zip(gpt2.model.parameters(), grads, strict=True))


def test_cancel_and_budget_stop_a_run(gpt2):
    problem = patching_problem(gpt2, IOI, IOI_SWAPPED, answer=" mary", contrast=" john")
    cancel = threading.Event()
    seen: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        seen.append((done, total))
        if done > 0:
            cancel.set()

    settings = RunSettings(progress=progress, cancel=cancel)
    before = model_state(gpt2.model)
    with pytest.raises(JobCancelledError):
        patching_report(
            gpt2, problem, ["exact"], ["head_position"], settings=settings, batch_size=4
        )
    assert model_state(gpt2.model) == before
    assert seen and seen[-1][0] < seen[-1][1]
    forward, _, _ = planned_passes(gpt2, problem, ["exact"], ["head"])
    with pytest.raises(BudgetExceededError):
        patching_report(
            gpt2, problem, ["exact"], ["head"], settings=RunSettings(max_forward_passes=forward - 1)
        )


def test_a_report_on_gqa_llama_names_kv_heads_and_counts_its_passes(llama):
    assert llama.num_kv_heads < llama.num_heads  # grouped-query attention
    problem = patching_problem(llama, IOI, IOI_SWAPPED, answer=" mary", contrast=" john")
    report = patching_report(llama, problem, components=["residual", "head"])
    table = report.table
    assert list(table.columns) == list(COLUMNS)
    heads = table[table["component"] == "head"]
    assert (heads["kv_head"] == heads["head"] // (llama.num_heads // llama.num_kv_heads)).all()
    forward, backward, _ = planned_passes(llama, problem, None, ["residual", "head"])
    assert (report.forward_passes, report.backward_passes) == (forward, backward)
    # residual sites whose activation is the same in both runs change nothing, by any estimator
    same = [t for t in range(len(problem.clean.token_texts)) if t < 8]  # before the swap
    first = table[(table["component"] == "residual") & (table["layer"] == 0)]
    assert first[first["position"].isin(same)]["effect"].abs().max() < 1e-9
    assert set(report.agreement["estimator"]) == {"atp", "atp_star", "relp"}
    assert report.to_dict()["table"][0]["estimator"] == "exact"


def test_noising_and_denoising_meet_on_one_scale(gpt2):
    problem = patching_problem(gpt2, IOI, IOI_SWAPPED, answer=" mary", contrast=" john")
    table = patching_report(gpt2, problem, ["exact"], ["residual"]).table
    first = table[table["layer"] == 0].set_index(["direction", "position"])["normalised"]
    swapped = 8  # the only position whose token differs: it carries the whole difference
    assert first["denoising", swapped] == pytest.approx(1.0)
    assert first["noising", swapped] == pytest.approx(0.0, abs=1e-9)
    others = [p for p in range(len(problem.clean.token_texts)) if p != swapped]
    assert np.allclose(first.loc["denoising"].loc[others], 0.0)
    assert np.allclose(first.loc["noising"].loc[others], 1.0)


def test_gaussian_noise_is_reproducible_and_stays_on_its_tokens(gpt2):
    def report(seed: int, estimators: list[str]):
        noise = GaussianNoise(positions=(1,), seeds=2, seed=seed)
        problem = patching_problem(gpt2, IOI, answer=" mary", contrast=" john", noise=noise)
        return patching_report(gpt2, problem, estimators, ["residual"], ["denoising"])

    first, again = report(0, ["exact", "atp"]), report(0, ["exact", "atp"])
    other = report(7, ["atp"])
    assert len(first.corrupted_scores) == 2
    assert first.corrupted_scores == again.corrupted_scores
    assert first.corrupted_scores != other.corrupted_scores
    assert first.table.equals(again.table)
    layer0 = first.table[(first.table["layer"] == 0) & (first.table["estimator"] == "exact")]
    by_position = layer0.set_index("position")["normalised"]
    assert by_position[1] == pytest.approx(1.0)  # the noised token, restored in every draw
    assert by_position.drop(1).abs().max() < 1e-9


def test_bad_problems_are_refused_by_name(gpt2):
    with pytest.raises(InvalidInputError, match="same length"):
        patching_problem(gpt2, IOI, IOI + " again", answer=" mary", contrast=" john")
    with pytest.raises(InvalidInputError, match="nothing for patching to restore"):
        problem = patching_problem(gpt2, IOI, IOI, answer=" mary", contrast=" john")
        patching_report(gpt2, problem, ["atp"], ["mlp"])
    problem = patching_problem(gpt2, IOI, IOI_SWAPPED, answer=" mary", contrast=" john")
    with pytest.raises(InvalidParameterError, match="unknown component"):
        patching_report(gpt2, problem, components=["heads"])
    with pytest.raises(InvalidParameterError, match="unknown estimator"):
        patching_report(gpt2, problem, estimators=["atp*"])
    with pytest.raises(InvalidInputError, match="outside"):
        patching_problem(gpt2, IOI, noise=GaussianNoise(positions=(99,)))
    with pytest.raises(InvalidParameterError, match="layer 5"):
        patched_score(gpt2, problem, "residual", 5)
    with pytest.raises(InvalidInputError, match="decoder LM's target is its answer"):
        patching_problem(gpt2, IOI, IOI_SWAPPED, target=3)


def test_a_classifiers_problem_reads_its_class_logit_and_refuses_answers(bert):
    problem = patching_problem(bert, "a fine film", "a poor film")  # the clean top class
    with torch.no_grad():
        clean = bert.logits(**bert.preprocess("a fine film").model_kwargs())[0]
        corrupted = bert.logits(**bert.preprocess("a poor film").model_kwargs())[0]
    top = int(clean.argmax())
    report = patching_report(bert, problem, ["exact"], ["mlp"], ["denoising"])
    assert report.target == bert.label(top)
    assert report.clean_score == pytest.approx(float(clean[top]), abs=1e-5)
    assert report.corrupted_score == pytest.approx(float(corrupted[top]), abs=1e-5)
    with pytest.raises(InvalidInputError, match="is a classifier"):
        patching_problem(bert, "a fine film", "a poor film", answer=" yes")


def test_exact_batches_halve_on_out_of_memory_with_the_same_values(llama):
    """Every attention output projection refuses more than 3 rows, as a full GPU would."""
    problem = patching_problem(llama, IOI, IOI_SWAPPED, answer=" mary", contrast=" john")
    plain = patching_report(llama, problem, ["exact"], ["head"], ["denoising"])

    def refuse(_module, args):
        if args[0].shape[0] > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    handles = [block.self_attn.o_proj.register_forward_pre_hook(refuse) for block in llama.blocks()]
    try:
        tight = patching_report(llama, problem, ["exact"], ["head"], ["denoising"])
    finally:
        for handle in handles:
            handle.remove()
    pd.testing.assert_frame_equal(tight.table, plain.table, rtol=1e-6)
    assert tight.forward_passes == plain.forward_passes  # rows, however they are batched
