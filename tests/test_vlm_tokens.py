"""Visual-token importance and ShortV's layer contribution (issue 40, items 4 and 5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _model_state import model_state
from _tiny_vlm import (
    model_module,
    tiny_gemma3,
    tiny_idefics3,
    tiny_llava,
    tiny_llava_next,
    tiny_paligemma,
    tiny_qwen2_5_vl,
    tiny_qwen2_vl,
    tiny_smolvlm,
)
from scipy.stats import spearmanr

from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.explain import explain
from attrlab.attribution.models.vlm import ImagePrompt, with_answer
from attrlab.attribution.request.answers import answer_target, given_answer
from attrlab.attribution.visual_tokens.answer import batched_kwargs
from attrlab.attribution.visual_tokens.layers import layer_contribution
from attrlab.attribution.visual_tokens.removal import VISUAL_TOKEN, dropped_rows, visual_attention
from attrlab.attribution.visual_tokens.scorers import VISUAL_SCORERS, Scoring
from attrlab.attribution.visual_tokens.study import visual_token_study


def _image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def llava():
    return tiny_llava()


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen2_vl()


def _answered(adapter, image: np.ndarray, answer: str = " a red cup"):
    inputs = adapter.preprocess(ImagePrompt(image, "what is on the table"))
    return with_answer(adapter, inputs, given_answer(adapter, answer))


@pytest.fixture(scope="module")
def llava_item(llava):
    return _answered(llava, _image(32, 32))


@pytest.fixture(scope="module")
def qwen_item(qwen):
    return _answered(qwen, _image(32, 48))


#: Every tiny family but LLaVA and Qwen2-VL (the fixtures above), built once per module.
_OTHER_FAMILIES = {
    "llava_next": tiny_llava_next,
    "qwen2_5_vl": tiny_qwen2_5_vl,
    "paligemma": tiny_paligemma,
    # Gemma 3's sliding windows count positions in the sequence: a window wider than it here
    # (a narrower one: test_gemma3_windows_count_the_positions_of_the_full_sequence)
    "gemma3": lambda: tiny_gemma3(sliding_window=256),
    "idefics3": tiny_idefics3,
    "smolvlm": tiny_smolvlm,
}
FAMILIES = ["llava", "qwen2_vl", *_OTHER_FAMILIES]


@pytest.fixture(scope="module")
def families(llava, llava_item, qwen, qwen_item):
    """A family's name -> its tiny adapter and an answered item on a 32-px image."""
    built = {"llava": (llava, llava_item), "qwen2_vl": (qwen, qwen_item)}

    def family(name: str):
        if name not in built:
            adapter = _OTHER_FAMILIES[name]()
            built[name] = (adapter, _answered(adapter, _image(32, 32)))
        return built[name]

    return family


def _embeddings_and_positions(adapter, inputs):
    """
    What the model gives its language model in a plain run: embeddings and position ids.

    The embeddings hold the visual features in place; the position ids are the family's (one
    row per rotary section for Qwen2-VL, from 1 for PaliGemma; from 0 where the model leaves
    them to the language model).
    """
    seen: dict = {}
    language_model = model_module(adapter, r"^model\.(language_model|text_model)$")
    handle = language_model.register_forward_pre_hook(
        lambda _m, _a, kwargs: seen.update(kwargs), with_kwargs=True
    )
    try:
        with torch.no_grad():
            adapter.model(**inputs.model_kwargs())
    finally:
        handle.remove()
    positions = seen.get("position_ids")
    if positions is None:
        positions = torch.arange(inputs.input_ids.shape[1])[None]
    return seen["inputs_embeds"], positions


def _kept_run(adapter, inputs, kept: torch.Tensor, positions, **given) -> torch.Tensor:
    """
    The family's model on the kept positions alone, each with its position id.

    ``given``: ``input_ids`` or ``inputs_embeds`` of the kept positions. The per-token inputs
    (PaliGemma's and Gemma 3's token types: the prefix read both ways, the image block) are
    cut to them; no image input is given.
    """
    per_token = {
        key: value[:, kept]
        for key, value in inputs.image_kwargs.items()
        if value.shape == inputs.input_ids.shape
    }
    # an attention mask, else transformers reads a gap in the position ids as packed sequences
    ones = torch.ones(1, int(kept.sum()), dtype=torch.long)
    with torch.no_grad():
        return adapter.model(
            attention_mask=ones,
            position_ids=positions[..., kept],
            use_cache=False,
            **per_token,
            **given,
        ).logits


def _removed_logits(adapter, inputs, hidden, positions, kept: torch.Tensor) -> torch.Tensor:
    """The model run on the kept rows of its language model's input ``hidden`` alone."""
    return _kept_run(adapter, inputs, kept, positions, inputs_embeds=hidden[:, kept])


def _text_only_logits(adapter, inputs) -> torch.Tensor:
    """The family's own text-only run: the prompt's text tokens, no image, same position ids."""
    _, positions = _embeddings_and_positions(adapter, inputs)
    text = ~inputs.visual_tokens
    return _kept_run(adapter, inputs, text, positions, input_ids=inputs.input_ids[:, text])


@pytest.mark.parametrize("family", FAMILIES)
def test_masking_keys_equals_removing_the_tokens(family, families):
    adapter, inputs = families(family)
    count = int(inputs.visual_tokens.sum())
    chosen = [[0, 3, 5], list(range(count))]  # some, then every visual token
    dropped = dropped_rows(inputs, chosen)
    with torch.no_grad(), visual_attention(adapter, dropped):
        logits = adapter.model(**batched_kwargs(inputs, len(chosen))).logits
    hidden, positions = _embeddings_and_positions(adapter, inputs)
    for row in range(len(chosen)):
        kept = ~dropped[row]
        reference = _removed_logits(adapter, inputs, hidden, positions, kept)
        torch.testing.assert_close(logits[row, kept][None], reference, atol=1e-5, rtol=1e-5)
    # every visual token dropped is the family's own run on the text alone, without the image
    text = ~inputs.visual_tokens
    text_only = _text_only_logits(adapter, inputs)
    torch.testing.assert_close(logits[1, text][None], text_only, atol=1e-5, rtol=1e-5)
    # dropping nothing is the plain model, whose text positions read the image
    with torch.no_grad(), visual_attention(adapter, dropped_rows(inputs, [[]])):
        same = adapter.model(**inputs.model_kwargs()).logits
    with torch.no_grad():
        plain = adapter.model(**inputs.model_kwargs()).logits
    torch.testing.assert_close(same, plain, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(plain[:, text], text_only, atol=1e-4)


def test_gemma3_windows_count_the_positions_of_the_full_sequence():
    # Gemma 3 with windows narrower than the sequence has no text-only run equal to dropping
    # every visual token: masking keeps each window where the full sequence puts it (a text
    # token just after the image reads only what its window held there, the image's keys
    # masked), while the family's own text-only run slides its windows over the text alone,
    # back past where the image was. Dropping every visual token equals the run on the text
    # alone with each window counted over the full sequence's positions (masks written here).
    adapter = tiny_gemma3()  # both blocks slide a window of 4 tokens
    inputs = _answered(adapter, _image(32, 32))
    text = ~inputs.visual_tokens
    every = list(range(int(inputs.visual_tokens.sum())))
    with torch.no_grad(), visual_attention(adapter, dropped_rows(inputs, [every])):
        logits = adapter.model(**inputs.model_kwargs()).logits[:, text]
    origin = torch.nonzero(text)[:, 0]  # each text token's position in the full sequence
    behind = origin[:, None] - origin[None, :]  # how far each key is behind each query

    def additive(allowed: torch.Tensor) -> torch.Tensor:
        blocked = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        return blocked[None, None]

    windows = {
        "full_attention": additive(behind >= 0),
        "sliding_attention": additive((behind >= 0) & (behind < 4)),
    }
    _, positions = _embeddings_and_positions(adapter, inputs)
    with torch.no_grad():
        reference = adapter.model(
            input_ids=inputs.input_ids[:, text],
            attention_mask=windows,
            position_ids=positions[..., text],
            use_cache=False,
        ).logits
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits, _text_only_logits(adapter, inputs), atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_route_is_undone_after_a_forced_error(family, families):
    adapter, inputs = families(family)
    kwargs = batched_kwargs(inputs, 2)
    with torch.no_grad():
        before = adapter.model(**kwargs).logits
    state = model_state(adapter.model)  # transformers' own hooks included
    kernels = [a.config._attn_implementation for a in adapter.attention_modules()]
    seen: list[list[str]] = []

    def fail(*_args):
        seen.append([a.config._attn_implementation for a in adapter.attention_modules()])
        raise RuntimeError("forced")

    handle = adapter.blocks()[-1].register_forward_hook(fail)
    try:
        dropped = dropped_rows(inputs, [[0, 1], []])
        with (
            pytest.raises(RuntimeError, match="forced"),
            torch.no_grad(),
            visual_attention(adapter, dropped, layer=1, read={0}),
        ):
            adapter.model(**kwargs)
    finally:
        handle.remove()
    assert len(seen) == 1 and all(a != b for a, b in zip(seen[0], kernels, strict=True))
    assert model_state(adapter.model) == state
    with torch.no_grad():
        torch.testing.assert_close(adapter.model(**kwargs).logits, before, atol=0, rtol=0)


def test_dropping_at_a_layer_equals_removing_the_tokens_from_that_layer_on(llava, llava_item):
    dropped = dropped_rows(llava_item, [[1, 2, 8, 13]])
    with torch.no_grad(), visual_attention(llava, dropped, layer=1):
        logits = llava.model(**llava_item.model_kwargs()).logits
    with torch.no_grad():
        hidden = llava.model(**llava_item.model_kwargs(), output_hidden_states=True).hidden_states
    language_model = llava.model.model.language_model
    layers = language_model.layers
    kept = ~dropped[0]
    language_model.layers = layers[1:]  # block 0 ran on every token; blocks 1 on without them
    try:
        reference = _removed_logits(
            llava, llava_item, hidden[1], torch.arange(len(kept))[None], kept
        )
    finally:
        language_model.layers = layers
    torch.testing.assert_close(logits[0, kept][None], reference, atol=1e-5, rtol=1e-5)
    with torch.no_grad(), visual_attention(llava, dropped, layer=0):  # not the same as at input
        early = llava.model(**llava_item.model_kwargs())
    assert not torch.allclose(logits, early.logits)


def _answer_log_prob(logits: torch.Tensor, inputs) -> torch.Tensor:
    """The answer's log-probability, summed over its tokens, read by hand."""
    count = inputs.answer_length
    start = inputs.input_ids.shape[1] - count
    log_probs = torch.log_softmax(logits[0].double(), -1)
    answer = inputs.input_ids[0, start:]
    return sum(log_probs[start - 1 + s, answer[s]] for s in range(count))


def _attentions(adapter, inputs):
    with torch.no_grad():
        return adapter.model(**inputs.model_kwargs(), output_attentions=True).attentions


def test_fastv_is_the_attention_from_the_last_token_or_the_instruction(llava, llava_item):
    attentions = _attentions(llava, llava_item)
    visual = llava_item.visual_positions
    last = llava_item.input_ids.shape[1] - llava_item.answer_length - 1
    instruction = list(range(int(visual[-1]) + 1, last + 1))
    for layer in (0, 1):
        scoring = Scoring(llava, llava_item, attention_layer=layer)
        probabilities = attentions[layer][0].double()  # (H, T, T)
        expected_last = probabilities[:, last, visual].mean(0)
        expected_text = probabilities[:, instruction][:, :, visual].mean((0, 1))
        np.testing.assert_allclose(VISUAL_SCORERS["fastv"].score(scoring), expected_last, atol=1e-6)
        np.testing.assert_allclose(
            VISUAL_SCORERS["fastv_text"].score(scoring), expected_text, atol=1e-6
        )


def test_transprune_is_transition_variation_plus_instruction_attention(llava, llava_item):
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    handles = []
    for block in llava.blocks():
        handles.append(
            block.self_attn.register_forward_hook(
                lambda _m, _a, kw, out: seen.append((kw["hidden_states"], out[0])),
                with_kwargs=True,
            )
        )
        handles.append(block.mlp.register_forward_hook(lambda _m, a, out: seen.append((a[0], out))))
    try:
        attentions = _attentions(llava, llava_item)
    finally:
        for handle in handles:
            handle.remove()
    end = llava_item.input_ids.shape[1] - llava_item.answer_length
    visual = llava_item.visual_positions
    ttv = torch.zeros(end, dtype=torch.float64)
    for x, y in seen[:2]:  # block 0's attention and MLP: the blocks before layer 1
        x, y = x[0, :end].double(), y[0, :end].double()
        ratio = y.norm(dim=-1) / x.norm(dim=-1)
        cosine = (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1))
        weights = torch.exp(1 - cosine) / torch.exp(1 - cosine).sum()
        ttv += ratio * weights
    ttv = ttv[visual]
    instruction = list(range(int(visual[-1]) + 1, end))
    iga = attentions[1][0].double()[:, instruction][:, :, visual].mean((0, 1))
    expected = ttv / ttv.sum() + iga / iga.sum()
    scored = VISUAL_SCORERS["transprune"].score(Scoring(llava, llava_item, attention_layer=1))
    np.testing.assert_allclose(scored, expected.numpy(), rtol=1e-5, atol=1e-7)


def test_vtc_cls_averages_the_cls_rows_over_encoder_layers(llava_item):
    adapter = tiny_llava()
    adapter.model.config.vision_feature_layer = -1  # both encoder layers feed the tokens
    tower = adapter.model.model.vision_tower
    with torch.no_grad():
        attentions = tower(llava_item.pixel_values, output_attentions=True).attentions
    cls_rows = torch.stack([a[0, :, 0, 1:] for a in attentions]).double()  # CLS dropped
    expected = cls_rows.mean((0, 1))
    scored = VISUAL_SCORERS["vtc_cls"].score(Scoring(adapter, llava_item))
    np.testing.assert_allclose(scored, expected.numpy(), atol=1e-6)
    assert len(scored) == int(llava_item.visual_tokens.sum())


def test_vtc_cls_says_where_it_does_not_apply(llava, qwen):
    assert VISUAL_SCORERS["vtc_cls"].applies_to(llava) is None
    assert "not applicable" in VISUAL_SCORERS["vtc_cls"].applies_to(qwen)


def test_gradient_x_input_at_the_first_block_input(llava, llava_item):
    hidden, positions = _embeddings_and_positions(llava, llava_item)
    leaf = hidden.clone().requires_grad_()
    out = llava.model.model.language_model(inputs_embeds=leaf, position_ids=positions)
    log_prob = _answer_log_prob(llava.model.lm_head(out.last_hidden_state), llava_item)
    (gradient,) = torch.autograd.grad(log_prob, leaf)
    expected = (gradient * leaf).sum(-1)[0, llava_item.visual_positions].detach()
    scored = VISUAL_SCORERS["gradient_x_input"].score(Scoring(llava, llava_item))
    np.testing.assert_allclose(scored, expected.double().numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("layer", [0, 1])
def test_atp_is_the_gradient_at_the_probabilities_times_their_change(llava, llava_item, layer):
    out = llava.model(**llava_item.model_kwargs(), output_attentions=True)
    for attention in out.attentions:
        attention.retain_grad()
    _answer_log_prob(out.logits, llava_item).backward()
    visual = llava_item.visual_positions.tolist()
    expected = np.zeros(len(visual))
    for block in range(layer, len(out.attentions)):
        p = out.attentions[block][0].detach().double()  # (H, T, T)
        grad = out.attentions[block].grad[0].double()
        for n, j in enumerate(visual):
            changed = p / (1 - p[:, :, j : j + 1])  # each row renormalised without key j
            changed[:, :, j] = 0.0
            changed[:, j] = p[:, j]  # the dropped token still reads itself
            expected[n] -= float((grad * (changed - p)).sum())
    scored = VISUAL_SCORERS["atp"].score(Scoring(llava, llava_item, layer=layer))
    np.testing.assert_allclose(scored, expected, rtol=1e-4, atol=1e-7)


def test_exact_is_the_drop_with_each_token_removed(llava, llava_item):
    hidden, positions = _embeddings_and_positions(llava, llava_item)
    length = llava_item.input_ids.shape[1]
    full = _answer_log_prob(
        _removed_logits(llava, llava_item, hidden, positions, torch.ones(length) > 0), llava_item
    )
    expected = []
    for j in llava_item.visual_positions.tolist():
        kept = torch.ones(length, dtype=torch.bool)
        kept[j] = False
        logits = torch.zeros(1, length, llava.model.lm_head.out_features)
        logits[:, kept] = _removed_logits(llava, llava_item, hidden, positions, kept)
        expected.append(float(full - _answer_log_prob(logits, llava_item)))
    scored = VISUAL_SCORERS["exact"].score(Scoring(llava, llava_item))
    np.testing.assert_allclose(scored, expected, rtol=1e-4, atol=1e-5)


def test_the_unit_kind_lists_each_visual_position_and_drops_at_the_input(llava, llava_item):
    sites = VISUAL_TOKEN.sites(llava, llava_item)
    assert [s.position for s in sites] == llava_item.visual_positions.tolist()
    rows = [[sites[2], sites[7]], []]
    with torch.no_grad(), VISUAL_TOKEN.removal("input")(llava, rows):
        logits = llava.model(**batched_kwargs(llava_item, 2)).logits
    with torch.no_grad(), visual_attention(llava, dropped_rows(llava_item, [[2, 7], []])):
        reference = llava.model(**batched_kwargs(llava_item, 2)).logits
    torch.testing.assert_close(logits, reference, atol=0, rtol=0)
    with pytest.raises(InvalidInputError):
        VISUAL_TOKEN.sites(llava, None)


def test_the_study_measures_each_point_as_removing_the_tokens(llava, llava_item):
    ratios = (1.0, 0.5, 0.25)
    study = visual_token_study(
        llava, [llava_item], ["fastv", "gradient_x_input", "exact"], ratios=ratios, draws=4
    )
    hidden, positions = _embeddings_and_positions(llava, llava_item)
    length = llava_item.input_ids.shape[1]
    visual = llava_item.visual_positions
    curves = study.curves.curves
    for name in ("fastv", "gradient_x_input", "exact"):
        scores = np.asarray(study.scores[0][name])
        for ratio in ratios[1:]:
            keep = round(ratio * len(scores))
            kept = torch.ones(length, dtype=torch.bool)
            kept[visual[np.argsort(-scores, kind="stable")[keep:]]] = False
            logits = torch.zeros(1, length, llava.model.lm_head.out_features)
            logits[:, kept] = _removed_logits(llava, llava_item, hidden, positions, kept)
            expected = float(_answer_log_prob(logits, llava_item))
            row = curves[
                (curves.order == name)
                & (curves.metric == "log_prob")
                & np.isclose(curves.removed, 1 - ratio)
            ]
            assert float(row.value.iloc[0]) == pytest.approx(expected, abs=1e-4)
    full = curves[(curves.removed == 0) & (curves.metric == "kl")]
    assert np.allclose(full.value, 0.0)
    verdicts = {v.check for v in study.curves.verdicts}
    assert verdicts == {
        f"visual_token_pruning:{n}:{m}"
        for n in ("fastv", "gradient_x_input", "exact")
        for m in ("log_prob", "exact_match", "kl")
    }
    random = study.curves.scores[study.curves.scores.order == "random"]
    assert random["std"].notna().all()  # a band from several draws
    # agreement: signed Spearman with the exact effects, computed here again
    exact = np.asarray(study.scores[0]["exact"])
    for name in ("fastv", "gradient_x_input"):
        rho = spearmanr(study.scores[0][name], exact)[0]
        row = study.agreement[study.agreement.scorer == name]
        assert float(row.spearman.iloc[0]) == pytest.approx(rho)
    assert "exact" not in set(study.agreement.scorer)
    assert study.not_applicable == {}


def test_the_study_at_a_layer_and_scorers_that_do_not_apply(qwen, qwen_item):
    study = visual_token_study(
        qwen,
        [qwen_item],
        ["fastv_text", "vtc_cls", "transprune"],
        layer=1,
        ratios=(1.0, 0.5),
        draws=2,
    )
    assert set(study.not_applicable) == {"vtc_cls"}
    assert [s["name"] for s in study.scorers] == ["fastv_text", "transprune"]
    assert study.to_dict()["layer"] == 1
    with pytest.raises(InvalidParameterError):
        visual_token_study(qwen, [qwen_item], ["vtc_cls"])


def test_every_hook_is_undone_after_an_error(llava, llava_item):
    model = llava.model
    attentions = llava.attention_modules()
    configs = [a.config for a in attentions]

    def hooks() -> list[int]:
        return [
            len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
            for m in model.modules()
        ]

    held = hooks()
    with torch.no_grad():
        before = model(**llava_item.model_kwargs()).logits

    def fail(*_args):
        raise RuntimeError("forced")

    handle = llava.blocks()[1].register_forward_hook(fail)
    try:
        for name in ("fastv", "transprune", "gradient_x_input", "atp", "exact"):
            with pytest.raises(RuntimeError, match="forced"):
                VISUAL_SCORERS[name].score(Scoring(llava, llava_item))
        with pytest.raises(RuntimeError, match="forced"):
            layer_contribution(llava, llava_item)
    finally:
        handle.remove()
    assert [a.config for a in attentions] == configs
    assert hooks() == held
    with torch.no_grad():
        after = model(**llava_item.model_kwargs()).logits
    torch.testing.assert_close(after, before, atol=0, rtol=0)


@pytest.mark.parametrize("family", ["llava", "qwen"])
def test_shortv_equals_a_hand_written_identity_on_the_visual_tokens(family, request):
    adapter = request.getfixturevalue(family)
    inputs = request.getfixturevalue(f"{family}_item")
    visual = inputs.visual_tokens
    count = inputs.answer_length
    start = inputs.input_ids.shape[1] - count
    answer = inputs.input_ids[0, start:]

    def answer_log_probs() -> torch.Tensor:
        with torch.no_grad():
            logits = adapter.model(**inputs.model_kwargs()).logits
        return torch.log_softmax(logits[0, start - 1 : start - 1 + count].double(), -1)

    full = answer_log_probs()
    table = layer_contribution(adapter, inputs)
    assert list(table.columns) == ["layer", "head", "kv_head", "component", "measure", "value"]
    for block_index, block in enumerate(adapter.blocks()):

        def identity_on_visual(_m, args, kwargs, out):
            hidden = args[0] if args else kwargs["hidden_states"]
            output = out if isinstance(out, torch.Tensor) else out[0]
            replaced = torch.where(visual[None, :, None], hidden, output)
            return replaced if isinstance(out, torch.Tensor) else (replaced, *out[1:])

        handle = block.register_forward_hook(identity_on_visual, with_kwargs=True)
        try:
            frozen = answer_log_probs()
        finally:
            handle.remove()
        steps = torch.arange(count)
        expected = {
            "shortv_kl": float((full.exp() * (full - frozen)).sum(-1).mean()),
            "shortv_log_prob": float(frozen[steps, answer].sum() - full[steps, answer].sum()),
            "shortv_exact_match": float((frozen.argmax(-1) == answer).all()),
        }
        for measure, value in expected.items():
            row = table[(table.layer == block_index) & (table.measure == measure)]
            assert float(row.value.iloc[0]) == pytest.approx(value, abs=1e-5)
        # no block after the last reads the visual tokens: only the earlier ones move the answer
        last = block_index == len(adapter.blocks()) - 1
        assert (expected["shortv_kl"] == 0) if last else (expected["shortv_kl"] > 0)


def test_each_curve_point_is_one_forward_row(llava, llava_item):
    rows: list[int] = []
    language_model = llava.model.model.language_model
    handle = language_model.register_forward_pre_hook(
        lambda _m, _a, kwargs: rows.append(int(kwargs["inputs_embeds"].shape[0])),
        with_kwargs=True,
    )
    ratios = (1.0, 0.75, 0.5, 0.25)
    try:
        study = visual_token_study(llava, [llava_item], ["fastv"], ratios=ratios, draws=8)
    finally:
        handle.remove()
    count = int(llava_item.visual_tokens.sum())
    assert sum(rows) == study.forward_passes + 1  # FastV's reading forward beside the counted
    curves = study.forward_passes - 1 - (count + 1)  # the full row, the exact effects
    orders = curves / (len(ratios) - 1)
    assert orders == int(orders) and 1 + 1 <= orders <= 1 + 8  # FastV, then 1 to 8 random
    assert max(rows) <= 32


def test_attnlrp_is_the_relevance_at_the_visual_tokens_and_conserves_the_answer(llava, llava_item):
    scored = VISUAL_SCORERS["attnlrp"].score(Scoring(llava, llava_item))
    assert scored.shape == (int(llava_item.visual_tokens.sum()),)
    # the relevance of every position at the first block's input, visual and text, is the
    # answer's logits (read by hand from a plain forward) less what LRP's rules keep
    target = answer_target(llava, llava_item, given_answer(llava, " a red cup"))
    explained = explain(llava, "attnlrp", llava_item, target)
    np.testing.assert_allclose(
        scored, explained.scores[llava_item.visual_positions.numpy()], rtol=1e-6, atol=1e-9
    )
    with torch.no_grad():
        logits = llava.model(**llava_item.model_kwargs()).logits[0].double()
    n, length = llava_item.answer_length, logits.shape[0]
    answer = llava_item.input_ids[0, -n:]
    answer_logits = float(logits[torch.arange(length - n - 1, length - 1), answer].sum())
    kept = ("softmax", "bias", "positional")
    absorbed = sum(explained.metrics[f"{rule}_absorbed"] for rule in kept)
    assert explained.scores.sum() + absorbed == pytest.approx(answer_logits, abs=1e-4)
    assert np.abs(scored).sum() > 0  # the image carries some of it
