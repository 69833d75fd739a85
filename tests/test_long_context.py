"""
Long-context tasks: generated from a seed, sized to a budget, the answer where it must be.

Where the answer is is read back from the text by the test's own parsing (a key's line, the
needle's sentence, the chain of assignments followed by hand), never from the generator's
details; sizes are counted with SmolLM2's tokenizer. The model's input holds the answer as its
last tokens and the context as its first, each as the tokenizer reads it alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch
import transformers as tf

from attrlab.attribution.errors import InputTooLargeError, InvalidInputError, InvalidParameterError
from attrlab.attribution.inputs.long_context import (
    GENERATORS,
    MAX_TASKS,
    ContextTask,
    count_words,
    kv_retrieval,
    needle,
    needle_depths,
    read_tasks,
    task_inputs,
    task_prompt,
    token_counter,
    variable_tracking,
)
from attrlab.attribution.models.builtin import smollm2_folder
from attrlab.attribution.models.text import DecoderLMAdapter

#: Each kind with its own settings, as (seed, max_tokens, count) -> task.
MAKERS = {
    "kv_retrieval": lambda s, n, c: kv_retrieval(s, n, c),
    "kv_retrieval_spread": lambda s, n, c: kv_retrieval(s, n, c, pairs=6),
    "needle": lambda s, n, c: needle(s, 0.3, n, c),
    "variable_tracking": lambda s, n, c: variable_tracking(s, 3, 2, n, c),
}
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@pytest.fixture(scope="module")
def smol_tokenizer():
    """SmolLM2's byte-level BPE (the embedded model's), without its weights."""
    return tf.AutoTokenizer.from_pretrained(smollm2_folder())


@pytest.mark.parametrize("kind", MAKERS)
def test_a_seed_makes_one_task_and_seeds_differ(kind):
    make = MAKERS[kind]
    first, again = make(3, 400, count_words), make(3, 400, count_words)
    assert first == again
    others = {make(seed, 400, count_words).context for seed in range(4, 8)}
    assert first.context not in others and len(others) == 4
    assert first.task == kind.removesuffix("_spread")


def test_generators_leave_the_global_random_state_alone():
    import random

    random.seed(11)
    expected = random.random()
    random.seed(11)
    for kind in MAKERS:
        MAKERS[kind](0, 300, count_words)
    assert random.random() == expected
    assert set(GENERATORS) == {"kv_retrieval", "needle", "variable_tracking"}


@pytest.mark.parametrize("pairs", [None, 6])
def test_kv_retrieval_asks_a_key_whose_line_holds_the_answer(pairs):
    for seed in range(5):
        task = kv_retrieval(seed, 400, count_words, pairs=pairs)
        key = re.fullmatch(r"What is the value of (\S+)\?", task.question)[1]
        found = dict(re.findall(r"The value of (\S+) is (\d+)\.", task.context))
        assert len(found) == task.context.count("The value of ")  # keys distinct
        assert task.context.count(key) == 1
        assert task.context.count(task.answer) == 1
        assert found[key] == task.answer
        if pairs is not None:  # among filler: no word in two keys
            assert len(found) == pairs
            words = [word for k in found for word in k.split("-")]
            assert len(set(words)) == len(words)
        else:  # the list alone: every line a pair
            assert len(task.context.splitlines()) == len(found)


@pytest.mark.parametrize("depth", [0.0, 0.2, 0.5, 0.85, 1.0])
def test_the_needle_stands_at_the_depth_asked(depth):
    """Within half the longest filler sentence (and its space) of depth × the filler's length."""
    for seed in range(3):
        task = needle(seed, depth, 600, count_words)
        fact = f"{task.answer_prefix} {task.answer}."
        assert task.context.count(fact) == 1 and task.context.count(task.answer) == 1
        at = task.context.index(fact)
        filler = (task.context[:at] + task.context[at + len(fact) :]).replace("  ", " ").strip()
        longest = max(len(s) for s in SENTENCE_END.split(filler))
        assert abs(at - depth * len(filler)) <= longest / 2 + 1
        key = re.fullmatch(r"The special magic number for (\S+) is", task.answer_prefix)[1]
        assert f"number for {key} mentioned" in task.question


def test_needle_depths_move_one_needle_through_one_haystack():
    tasks = needle_depths(4, (0.0, 0.5, 1.0), 300, count_words)
    fact = f"{tasks[0].answer_prefix} {tasks[0].answer}."
    assert len({(t.answer, t.question) for t in tasks}) == 1
    hays = {" ".join(t.context.replace(fact, " ").split()) for t in tasks}
    assert len(hays) == 1
    assert tasks[0].context.startswith(fact) and tasks[-1].context.endswith(fact)
    assert 0 < tasks[1].context.index(fact) < len(tasks[1].context) - len(fact)


@pytest.mark.parametrize(("hops", "chains"), [(1, 1), (3, 2), (4, 3)])
def test_following_the_chain_by_hand_gives_the_answer(hops, chains):
    for seed in range(4):
        task = variable_tracking(seed, hops, chains, 500, count_words)
        assigned: dict[str, str] = {}
        for name, value in re.findall(r"VAR ([A-Z]{5}) = ((?:VAR [A-Z]{5})|\d+)\.", task.context):
            assert name not in assigned
            assert value.removeprefix("VAR ") in assigned or value.isdigit()  # defined before
            assigned[name] = value
        assert len(assigned) == chains * (hops + 1)
        name = re.fullmatch(r"What is the value of VAR ([A-Z]{5})\?", task.question)[1]
        steps = 0
        value = assigned[name]
        while value.startswith("VAR "):
            value = assigned[value.removeprefix("VAR ")]
            steps += 1
        assert (value, steps) == (task.answer, hops)
        numbers = [v for v in assigned.values() if v.isdigit()]
        assert len(set(numbers)) == chains and task.context.count(task.answer) == 1


@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize("max_tokens", [250, 1000])
def test_sizes_fit_max_tokens_of_the_tokenizer(smol_tokenizer, kind, max_tokens):
    count = token_counter(smol_tokenizer)
    task = MAKERS[kind](1, max_tokens, count)
    prompt, answer = task_prompt(task)
    tokens = len(smol_tokenizer(prompt + answer)["input_ids"])
    assert 0.85 * max_tokens <= tokens <= max_tokens  # filled, not overfilled
    words = MAKERS[kind](1, max_tokens, count_words)
    assert len(" ".join(task_prompt(words)).split()) <= max_tokens


def test_sizes_that_cannot_be_met_are_refused():
    with pytest.raises(InvalidParameterError, match="no room"):
        needle(0, 0.5, 20, count_words)
    with pytest.raises(InvalidParameterError, match="at most 8192"):
        kv_retrieval(0, 10_000, count_words)
    with pytest.raises(InvalidParameterError, match="depth"):
        needle(0, 1.5)
    with pytest.raises(InvalidParameterError, match="hops"):
        variable_tracking(0, hops=0)
    with pytest.raises(InvalidParameterError, match="pairs"):
        kv_retrieval(0, pairs=1)


def test_a_task_reads_back_from_json_and_its_details_stay_put():
    task = variable_tracking(2, 2, 2, 300, count_words)
    record = json.loads(json.dumps(task.to_json()))
    assert ContextTask.from_json(record) == task
    with pytest.raises(TypeError):
        task.details["seed"] = 5  # type: ignore[index]
    assert task.details["chains"][0] == tuple(record["details"]["chains"][0])  # arrays: tuples
    moved = replace(task, answer_prefix="")  # a task made from a task's details
    assert moved.to_json()["details"] == record["details"]
    with pytest.raises(InvalidInputError, match="JSON"):
        ContextTask("c", "q", "a", "jsonl", details={"when": object()})
    with pytest.raises(InvalidInputError, match="'answer' is empty"):
        ContextTask("c", "q", " ", "jsonl")


def test_the_prompt_ends_where_the_answer_continues():
    task = kv_retrieval(0, 300, count_words)
    prompt, answer = task_prompt(task)
    assert prompt.startswith(task.context)
    assert prompt.endswith(f"\n\nQuestion: {task.question}\nAnswer: {task.answer_prefix}")
    assert answer == " " + task.answer
    plain = ContextTask("Paris is in France. ", "Where is Paris?", "France", "jsonl")
    assert task_prompt(plain) == (
        "Paris is in France.\n\nQuestion: Where is Paris?\nAnswer:",
        " France",
    )


def _write(tmp_path, lines: list[str]):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = json.dumps(
    {"context": "Anna keeps a red kite.", "question": "What colour?", "answer": "red"}
)


def test_read_tasks_reads_each_line(tmp_path):
    tasks = read_tasks(_write(tmp_path, [GOOD, "", GOOD.replace("red", "blue")]))
    assert [t.answer for t in tasks] == ["red", "blue"]
    assert [t.details["line"] for t in tasks] == [1, 3]
    assert {t.task for t in tasks} == {"jsonl"}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: not a"),
        ('{"context": "c", "question": "q"}', "line 2: no 'answer'"),
        ('{"context": "c", "question": "q", "answer": ""}', "line 2: 'answer' is empty"),
        ('{"context": "  ", "question": "q", "answer": "a"}', "line 2: 'context' is empty"),
        ('{"context": "c", "question": 3, "answer": "a"}', "line 2: 'question' is not a text"),
        (
            '{"context": "c", "question": "q", "answer": "a", "anwser": "a"}',
            "line 2: unknown field 'anwser'",
        ),
        ('{"context": "c", "question": "q", "answer": "\\ud800"}', "line 2: 'answer'.*Unicode"),
    ],
)
def test_read_tasks_names_the_bad_line(tmp_path, line, message):
    with pytest.raises(InvalidInputError, match=message):
        read_tasks(_write(tmp_path, [GOOD, line, GOOD]))


def test_read_tasks_refuses_an_empty_file_and_too_many_tasks(tmp_path):
    for content in ("", "\n  \n"):
        path = tmp_path / "empty.jsonl"
        path.write_text(content, encoding="utf-8")
        with pytest.raises(InvalidInputError, match="holds no task"):
            read_tasks(path)
    assert len(read_tasks(_write(tmp_path, [GOOD] * MAX_TASKS))) == MAX_TASKS
    with pytest.raises(InputTooLargeError, match=f"more than {MAX_TASKS}"):
        read_tasks(_write(tmp_path, [GOOD] * (MAX_TASKS + 1)))


def test_read_tasks_refuses_a_file_it_cannot_read_as_text(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(GOOD.replace("red", "rouge é").encode("latin-1"))
    with pytest.raises(InvalidInputError, match=r"latin1\.jsonl: not UTF-8"):
        read_tasks(path)
    with pytest.raises(InvalidInputError, match="cannot be read"):
        read_tasks(tmp_path)  # a folder


@pytest.mark.parametrize("kind", MAKERS)
def test_the_largest_size_in_words_is_filled(kind):
    task = MAKERS[kind](0, 8192, count_words)
    words = len(" ".join(task_prompt(task)).split())
    assert (0.9 * 8192 if kind != "kv_retrieval" else 756 * 6) <= words <= 8192


def _own_ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_task_inputs_hold_context_first_and_answer_last_on_a_tiny_llama(load_model):
    adapter = load_model("tiny-random-llama")  # a WordPiece tokenizer, 128 positions
    tokenizer = adapter.tokenizer
    task = needle(5, 0.5, 100, token_counter(tokenizer))
    held = task_inputs(adapter, task)
    ids = held.inputs.input_ids[0].tolist()
    prompt, answer = task_prompt(task)
    context = _own_ids(tokenizer, task.context.rstrip())
    assert held.context_tokens == len(context) and ids[: len(context)] == context
    assert ids[len(context) : len(ids) - held.inputs.answer_length] == _own_ids(
        tokenizer, prompt[len(task.context.rstrip()) :]
    )
    assert ids[-held.inputs.answer_length :] == _own_ids(tokenizer, answer)
    assert held.target.tokens == tuple(_own_ids(tokenizer, answer))
    assert held.question_tokens == len(ids) - len(context) - held.inputs.answer_length > 0
    # the target reads each answer token's log-probability at the position before it
    kwargs = held.inputs.model_kwargs()
    with torch.no_grad():
        logits = adapter.model(**kwargs).logits
    length = held.inputs.answer_length
    by_hand = logits[0, -length - 1 : -1].log_softmax(-1)[range(length), ids[-length:]]
    read = held.target.from_logits(adapter, logits, kwargs)
    torch.testing.assert_close(read[0], by_hand)


def test_task_inputs_split_smollm2_tokens_where_the_whole_text_splits(smol_tokenizer):
    """SmolLM2's tokenizer merges nothing across the boundary: the pieces are the whole's."""
    torch.manual_seed(0)
    config = tf.LlamaConfig(
        vocab_size=len(smol_tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=1024,
    )
    adapter = DecoderLMAdapter(tf.LlamaForCausalLM(config).eval(), smol_tokenizer, "tiny-smol")
    count = token_counter(smol_tokenizer)
    for kind in MAKERS:
        task = MAKERS[kind](7, 300, count)
        held = task_inputs(adapter, task)
        prompt, answer = task_prompt(task)
        ids = held.inputs.input_ids[0].tolist()
        assert ids == list(smol_tokenizer(prompt + answer)["input_ids"])
        context = _own_ids(smol_tokenizer, task.context)
        assert held.context_tokens == len(context) and ids[: len(context)] == context
        assert held.inputs.text == prompt + answer
        assert smol_tokenizer.decode(ids[-held.inputs.answer_length :]) == answer


def test_task_inputs_refuse_a_task_longer_than_the_model_reads(load_model):
    adapter = load_model("tiny-random-llama")
    task = needle(0, 0.5, 400, count_words)
    with pytest.raises(InvalidInputError, match="reads at most 128"):
        task_inputs(adapter, task)


def test_smollm2_finds_the_needle_with_its_whole_cache(smollm2):
    """The premise of an eviction curve: the embedded model solves the shipped needle task."""
    count = token_counter(smollm2.tokenizer)
    for seed, depth in ((0, 0.0), (1, 0.5), (2, 1.0)):
        held = task_inputs(smollm2, needle(seed, depth, 250, count))
        length = held.inputs.answer_length
        with torch.no_grad():
            logits = smollm2.model(**held.inputs.model_kwargs()).logits[0]
        greedy = logits[-length - 1 : -1].argmax(-1).tolist()
        assert greedy == held.inputs.input_ids[0, -length:].tolist()  # each digit, teacher-forced
