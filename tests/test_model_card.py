"""Model cards in YAML as well as JSON: a flat YAML card in MASA's style, written here
from ModelCard's field list, loads equal to its JSON form through ModelCard.load and the scripts' readers;
comments, quoted strings and typed values; malformed cards are errors naming the file and the line."""
import json
from dataclasses import fields

import pytest

from minskill.masa.model_card import ModelCard, read_card_file

# One value per ModelCard field, in the style of MASA's released cards: quoted strings, a size string for
# parameter_count, plain integers, `true`, one comma-separated line of strengths, comments and blank lines.
YAML_CARD = """\
# Model card of a made-up target (written for this test)
# a comment line, and a blank line after it

name: "tiny-qwen"
family: "Qwen3"
variant: '1.7B'                 # single-quoted
parameter_count: "1.7B"
release_date: "2025-04"

architecture: "dense-transformer"
num_layers: 28
hidden_size: 2048
num_attention_heads: 16
num_kv_heads: 8
context_window: 32768
vocab_size: 151936

base_or_instruct: instruct      # a plain scalar, its comment dropped
alignment_method: "SFT + DPO # not a comment inside quotes"
training_data_size: "36T tokens"
multilingual: true

strengths: "follows formats, short answers, arithmetic"
weaknesses: "forgets units: it writes 5 instead of 5 km"
"""

JSON_CARD = {
    "name": "tiny-qwen", "family": "Qwen3", "variant": "1.7B", "parameter_count": 1_700_000_000,
    "release_date": "2025-04", "architecture": "dense-transformer", "num_layers": 28, "hidden_size": 2048,
    "num_attention_heads": 16, "num_kv_heads": 8, "context_window": 32768, "vocab_size": 151936,
    "base_or_instruct": "instruct", "alignment_method": "SFT + DPO # not a comment inside quotes",
    "training_data_size": "36T tokens", "multilingual": True,
    "strengths": ["follows formats, short answers, arithmetic"],
    "weaknesses": ["forgets units: it writes 5 instead of 5 km"]}


def test_the_yaml_card_covers_every_field():
    assert set(JSON_CARD) == {f.name for f in fields(ModelCard)}


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".card"])   # .card: not JSON-looking, so read as YAML
def test_yaml_card_loads_equal_to_its_json_form(tmp_path, suffix):
    (tmp_path / f"card{suffix}").write_text(YAML_CARD, encoding="utf-8")
    (tmp_path / "card.json").write_text(json.dumps(JSON_CARD), encoding="utf-8")
    from_yaml, from_json = ModelCard.load(tmp_path / f"card{suffix}"), ModelCard.load(tmp_path / "card.json")
    assert from_yaml == from_json == ModelCard(**JSON_CARD)
    assert from_yaml.alignment_method.endswith("# not a comment inside quotes")   # '#' inside quotes is text
    assert from_yaml.base_or_instruct == "instruct"                                # the plain comment is gone


def test_yaml_values_are_typed_by_their_field(tmp_path):
    path = tmp_path / "card.yaml"
    path.write_text("---\nparameter_count: 135M\nnum_layers: 30\nmultilingual: no\nvocab_size: ~\n"
                    "context_window:\nfamily: null\nstrengths:\n", encoding="utf-8")
    card = ModelCard.load(path)
    assert card.parameter_count == 135_000_000 and card.num_layers == 30 and card.multilingual is False
    assert card.vocab_size is None and card.context_window is None
    assert card.family == "unknown" and card.strengths == []     # null: the field's default


def test_yaml_cards_are_read_as_yaml_lists_and_continued_lines_too(tmp_path):
    """A real YAML reader: a list of strengths, a plain value continued on indented lines, a
    quoted value over two lines and a document-end marker all read as YAML reads them."""
    path = tmp_path / "card.yaml"
    path.write_text("---\nfamily: Qwen3\nstrengths:\n  - arithmetic\n  - short answers\nweaknesses: long\n"
                    "  plans\ntraining_data_size: \"36T\n  tokens\"\n...\n", encoding="utf-8")
    card = ModelCard.load(path)
    assert card.strengths == ["arithmetic", "short answers"] and card.weaknesses == ["long plans"]
    assert card.family == "Qwen3" and card.training_data_size == "36T tokens"


def test_scripts_read_yaml_cards(tmp_path):
    """evolve_masa.py's --model-card goes through ModelCard.load; rewrite.py's through read_card_file
    leniently (an unknown key dropped), both giving the same card."""
    from minskill.masa import rewriter
    path = tmp_path / "card.yaml"
    path.write_text(YAML_CARD + "homepage: 'https://example.org'\n", encoding="utf-8")
    assert rewriter.load_model_card(str(path)) == ModelCard(**JSON_CARD).to_json()
    with pytest.raises(ValueError, match=r"card\.yaml, line 25: unknown field 'homepage'"):
        ModelCard.load(path)
    data, where = read_card_file(path, strict=False)
    assert "homepage" not in data and where == f"model card {path}"


BAD_CARDS = [  # (YAML text, what the error must say)
    ("family: Qwen3\nnum_layers: many\n", r"card\.yaml, line 2: field 'num_layers' must be a whole number"),
    ("parameter_count: lots\n", r"line 1: field 'parameter_count' must be a whole number or a size"),
    ("context_window: 32K\n", r"line 1: field 'context_window' must be a whole number"),   # sizes: params only
    ("multilingual: sometimes\n", r"line 1: field 'multilingual' must be true, false or null"),
    ("family: Qwen3\nvariant: \"8B\n", r"card\.yaml, line 2: not valid YAML: while scanning a quoted scalar, found unexpected end"),
    ("family Qwen3\n", r"card\.yaml, line 1: expected 'key: value'"),
    ("family: Qwen3\nfamily: Llama\n", r"line 2: duplicate key 'family'"),
    ("num_layers:\n  - 28\n", r"line 1: field 'num_layers' must be one value, not a list"),
    ("family: &f Qwen3\n", r"line 1: not valid YAML: YAML anchors and aliases"),
    ("family: Qwen3\nvariant: 8B\n" + "x" * (256 * 1024), r"card\.yaml: \d+ bytes; a YAML card is at most 262144"),
    ("family:\n  name: Qwen3\n", r"line 1: field 'family' must be one value, not a nested mapping"),
    ("release: 2025\n", r"line 1: unknown field 'release'"),
]


@pytest.mark.parametrize("text, message", BAD_CARDS, ids=[m.split(":")[-1].strip()[:30] for _, m in BAD_CARDS])
def test_a_malformed_yaml_card_names_the_file_and_line(tmp_path, text, message):
    path = tmp_path / "card.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as error:
        ModelCard.load(path)
    assert str(path) in str(error.value)


def test_json_cards_stay_strict_and_missing_files_are_named(tmp_path):
    (tmp_path / "card.json").write_text(json.dumps({"parameter_count": "8B"}), encoding="utf-8")
    with pytest.raises(ValueError, match="'parameter_count' must be a non-negative integer"):
        ModelCard.load(tmp_path / "card.json")      # JSON has types: a string is no count there
    with pytest.raises(FileNotFoundError, match=r"model card .*nope\.yaml: no such file"):
        ModelCard.load(tmp_path / "nope.yaml")


BIG = "9" * 5000
UNREADABLE_CARDS = {  # file name, content, what the error must say (besides the file's name)
    "not UTF-8, YAML": ("card.yaml", b"family: Qwen3\nvariant: 8B\xff\n", r"line 2: not UTF-8 text \(byte 0xff"),
    "not UTF-8, JSON": ("card.json", b'{"family": "Qw\xc3"}', r"line 1: not UTF-8 text \(byte 0xc3"),
    "5000 digits, YAML": ("card.yaml", f"family: Qwen3\nnum_layers: {BIG}\n".encode(),
                          r"line 2: field 'num_layers' must be a whole number of at most 18 digits, got a 5000-digit"),
    "5000 digits, JSON": ("card.json", f'{{"num_layers": {BIG}}}'.encode(),
                          r"field 'num_layers' must be a non-negative integer of at most 18 digits.*5000-digit"),
    "huge size, YAML": ("card.yaml", f"parameter_count: {BIG}B\n".encode(),
                        r"line 1: field 'parameter_count' must be a whole number of at most 18 digits"),
    "nested, JSON": ("card.json", ('{"strengths": ' + "[" * 900 + "]" * 900 + "}").encode(),
                     r"field 'strengths' is nested more than 3 levels deep"),
    "unclosed, JSON": ("card.json", ('{"strengths": ' + "[" * 5000).encode(), r"JSON nested too deeply to read"),
}


@pytest.mark.parametrize("name, content, message", list(UNREADABLE_CARDS.values()), ids=list(UNREADABLE_CARDS))
def test_an_unreadable_card_names_the_file_and_the_line_or_field(tmp_path, name, content, message):
    """Invalid UTF-8 was a bare UnicodeDecodeError, a 5,000-digit num_layers Python's
    integer-limit message; both readers (strict and lenient) now say which file, line or field."""
    from minskill.masa import rewriter
    path = tmp_path / name
    path.write_bytes(content)
    for read in (ModelCard.load, lambda p: rewriter.load_model_card(str(p))):   # strict; lenient (read_card_file)
        with pytest.raises(ValueError, match=message) as error:
            read(path)
        assert f"model card {path}" in str(error.value)


def test_a_folder_as_card_says_it_is_a_folder(tmp_path):
    """A folder given as the card said "no such file"; rewrite.py's reader names what the folder lacks."""
    from minskill.masa import rewriter
    with pytest.raises(ValueError, match=rf"model card {tmp_path}: is a folder; a model card is a JSON or YAML file"):
        ModelCard.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="holds neither model_card.json .* nor config.json"):
        rewriter.load_model_card(str(tmp_path))
