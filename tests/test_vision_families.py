"""
DINOv2 (with and without registers), distilled DeiT and CLIP zero-shot on tiny random models:
the readout matches the tokens the logits are formed from, CLIP's logits are CLIP's own, every
method runs or is refused with its reason.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf
from _small_budgets import SMALL_BUDGETS

from attrlab import attribution
from attrlab.attribution.methods import available_methods
from attrlab.attribution.methods._attention import readout_weights
from attrlab.attribution.models import load
from attrlab.attribution.models.images import ImageTransform
from attrlab.attribution.models.vision import CLIPZeroShotAdapter, ViTAdapter

IMAGE = np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)
VIT_SIZES = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_labels": 5,
}
IMAGE_BUDGETS = {**SMALL_BUDGETS, "occlusion": {"window": 8}}  # 8-pixel windows on 32×32
TRANSFORM = ImageTransform((32, 32), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


def _seeded(build):
    torch.manual_seed(0)
    return build().eval()


def _vit_like(name: str) -> ViTAdapter:
    builders = {
        "dinov2": lambda: tf.Dinov2ForImageClassification(
            tf.Dinov2Config(**VIT_SIZES, mlp_ratio=2, attn_implementation="eager")
        ),
        "dinov2_registers": lambda: tf.Dinov2WithRegistersForImageClassification(
            tf.Dinov2WithRegistersConfig(
                **VIT_SIZES, mlp_ratio=2, num_register_tokens=2, attn_implementation="eager"
            )
        ),
        "deit_distilled": lambda: tf.DeiTForImageClassificationWithTeacher(
            tf.DeiTConfig(**VIT_SIZES, intermediate_size=64, attn_implementation="eager")
        ),
    }
    return ViTAdapter(_seeded(builders[name]), f"tiny-{name}", TRANSFORM)


@pytest.fixture(scope="module")
def clip(load_model):
    tokenizer = load_model("tiny-random-bert").tokenizer
    config = tf.CLIPConfig(
        text_config={
            "vocab_size": tokenizer.vocab_size,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 32,
            "eos_token_id": tokenizer.sep_token_id,  # pool at [SEP], as CLIP pools at its EOS
        },
        vision_config={**VIT_SIZES, "intermediate_size": 64},
        projection_dim=16,
    )
    config._attn_implementation = "eager"
    model = _seeded(lambda: tf.CLIPModel(config))
    return CLIPZeroShotAdapter(model, tokenizer, "tiny-clip", TRANSFORM, ["cat", "dog", "car"])


@pytest.mark.parametrize(
    ("name", "read"),
    [
        ("dinov2", "first_and_patches"),
        ("dinov2_registers", "first_and_patches"),
        ("deit_distilled", "first_two"),
    ],
)
def test_readout_is_where_the_logits_come_from(name, read):
    """The tokens with weight are exactly those whose final state the logits depend on."""
    adapter = _vit_like(name)
    assert adapter.readout == read
    pixels = adapter.preprocess(IMAGE).pixel_values
    last = {}
    (final_norm,) = [  # the norm after the last block, on every token's final state
        m for n, m in adapter.model.named_modules() if n.count(".") == 1 and n.endswith("layernorm")
    ]
    handle = final_norm.register_forward_hook(lambda _m, args, _o: last.setdefault("h", args[0]))
    try:
        logits = adapter.logits(pixel_values=pixels)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(logits[0].sum(), last["h"])
    used = grad[0].abs().sum(-1) > 0
    weights = readout_weights(adapter, used.shape[0])
    assert torch.equal(weights > 0, used)
    assert weights.sum().item() == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["dinov2", "dinov2_registers", "deit_distilled"])
def test_every_method_runs_or_is_refused_on_vision_transformers(name):
    _every_method(_vit_like(name))


def test_every_method_runs_or_is_refused_on_clip(clip):
    _every_method(clip)


def _every_method(adapter):
    inputs = adapter.preprocess(IMAGE)
    with torch.no_grad():
        before = adapter.logits(**inputs.model_kwargs())
    ran = []
    for method in available_methods():
        reason = method.unsupported_reason(adapter)
        if reason is not None:
            assert adapter.model_id in reason or "image" in reason or "text" in reason, reason
            continue
        e = attribution.explain(
            adapter, method.name, inputs, params=IMAGE_BUDGETS.get(method.name, {})
        )
        assert e.scores.shape == (32, 32) and np.all(np.isfinite(e.scores)), method.name
        with torch.no_grad():
            torch.testing.assert_close(adapter.logits(**inputs.model_kwargs()), before)
        ran.append(method.name)
    assert {"rollout", "attention_flow", "integrated_gradients", "rise"} <= set(ran)


def test_clip_logits_are_clips_own_zero_shot_logits(clip):
    pixels = clip.preprocess(IMAGE).pixel_values
    prompts = clip.tokenizer(
        [f"a photo of a {x}." for x in ("cat", "dog", "car")], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        expected = clip.clip(pixel_values=pixels, **prompts).logits_per_image
        got = clip.logits(pixel_values=pixels)
    torch.testing.assert_close(got, expected)
    relabelled = clip.with_labels(["boat", "tree"])
    assert relabelled.num_classes == 2 and relabelled.label(1) == "tree"
    with pytest.raises(attribution.errors.InvalidInputError, match="two distinct labels"):
        clip.with_labels(["boat"])


def test_clip_and_dinov2_load_from_folders(clip, tmp_path):
    clip_dir, dino_dir = tmp_path / "clip", tmp_path / "dino"
    clip.clip.save_pretrained(clip_dir)
    clip.tokenizer.save_pretrained(clip_dir)
    processor = {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}}
    tf.CLIPImageProcessor(**processor).save_pretrained(clip_dir)
    loaded = load(str(clip_dir), device="cpu")
    assert isinstance(loaded, CLIPZeroShotAdapter) and loaded.num_classes == 1000
    assert loaded.transform.size == (32, 32) and loaded.label(285) == "Egyptian cat"
    assert loaded.label(134) == "crane" and loaded.label(517) == "crane (517)"
    dino = _vit_like("dinov2")
    dino.model.save_pretrained(dino_dir)
    tf.BitImageProcessor(**processor).save_pretrained(dino_dir)
    reloaded = load(str(dino_dir), device="cpu")
    assert reloaded.readout == "first_and_patches" and reloaded.transform.size == (32, 32)
    inputs = reloaded.preprocess(IMAGE).model_kwargs()
    torch.testing.assert_close(reloaded.logits(**inputs), dino.logits(**inputs))
