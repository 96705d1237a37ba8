"""Whether prefix tokenization is sound for a tokenizer: its `Plan`, checked
once per tokenizer object (`plan`; for text pairs, `pair_plan`), from the
normalizers, pre-tokenizers, models and post-processors the argument in
`offload_vllm._prefix` holds for."""

from __future__ import annotations

import itertools
import json
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: Normalizers that keep a safe cut safe, with the settings they must have.
_NORMALIZERS: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "BertNormalizer": lambda n: True,
    "Lowercase": lambda n: True,
    "NFC": lambda n: True,
    "NFD": lambda n: True,
    "NFKC": lambda n: True,
    "NFKD": lambda n: True,
    "StripAccents": lambda n: True,
    "Nmt": lambda n: True,
    "Strip": lambda n: True,
    "Prepend": lambda n: True,
    # SentencePiece's character map: it rewrites each grapheme cluster on its
    # own, and a cut is a cluster boundary (`GRAPHEME_JOINED`).
    "Precompiled": lambda n: True,
    # One character for another (SentencePiece's " " -> "▁"), or a run of spaces
    # for one (SentencePiece's collapsing of spaces).
    "Replace": lambda n: n.get("pattern") in ({"String": " "}, {"Regex": " {2,}"})
    or (isinstance((pat := n.get("pattern", {})).get("String"), str) and len(pat["String"]) == 1 and not pat["String"].isalnum()),
}


#: Pre-tokenizers for which every pre-token of a prefix but the last is the whole text's.
_PRE_TOKENIZERS: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "BertPreTokenizer": lambda p: True,
    "Whitespace": lambda p: True,
    "WhitespaceSplit": lambda p: True,
    "Punctuation": lambda p: True,
    "Digits": lambda p: True,
    "ByteLevel": lambda p: p.get("use_regex", True) is True,
    "Metaspace": lambda p: p.get("split", True) is True,
}


_MODELS: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "WordPiece": lambda m: True,
    "BPE": lambda m: m.get("dropout") in (None, 0, 0.0),
    "Unigram": lambda m: True,
    "WordLevel": lambda m: True,
}


def _components_known(part: Mapping[str, Any] | None, known: Mapping[str, Callable[[Mapping[str, Any]], bool]]) -> bool:
    if part is None:
        return True
    kind = part.get("type")
    if kind == "Sequence":
        items = part.get("normalizers", part.get("pretokenizers"))
        return isinstance(items, list) and all(_components_known(item, known) for item in items)
    check = known.get(str(kind))
    return check is not None and check(part)


def unsound_because(tokenizer: Any) -> str | None:
    """Why prefix tokenization could give other tokens than the whole text's
    with `tokenizer` (a `transformers` tokenizer), or `None` when it cannot."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return "not a fast (Rust) tokenizer"
    import tokenizers

    if not isinstance(backend, tokenizers.Tokenizer):
        # vLLM's `VLLM_USE_FASTOKENS=1` swaps in fastokens' shim: its word
        # indices and normalization are not the ones argued for here.
        return f"its backend is {type(backend).__module__}.{type(backend).__name__}, not the tokenizers library's"
    try:
        spec = json.loads(backend.to_str())
    except Exception as exc:  # an unexpected backend: whole-text tokenization
        return f"its description could not be read ({exc!r})"
    if not _components_known(spec.get("normalizer"), _NORMALIZERS):
        return f"normalizer {spec.get('normalizer')!r} is not one known to keep a cut"
    if spec.get("pre_tokenizer") is None:
        return "no pre-tokenizer: the whole text is one pre-token"
    if not _components_known(spec.get("pre_tokenizer"), _PRE_TOKENIZERS):
        return f"pre-tokenizer {spec.get('pre_tokenizer')!r} is not one known to keep a cut"
    if not _components_known(spec.get("model"), _MODELS):
        return f"model {spec.get('model', {}).get('type')!r} with these settings is not known to tokenize per pre-token"
    if not _every_word_gives_a_token(spec.get("model") or {}, spec.get("pre_tokenizer")):
        return "a word may give no token (no unknown token, no byte fallback)"
    normalizer = getattr(backend, "normalizer", None)
    described = json.dumps(spec.get("normalizer"))
    if "Precompiled" in described and (gone := _letters_removed(described, normalizer)):
        return f"the normalizer makes {gone!r} no letter or digit: a word may give no token"
    # What a cut's whitespace becomes, between two letters: what an added
    # token matched on the normalized text must not hold, or it could match
    # across the cut.
    marks = {ch: _between_letters(normalizer, ch) for ch in " \t\n\r"}
    for added in spec.get("added_tokens") or ():
        content = str(added.get("content", ""))
        if any(ch.isspace() for ch in content):
            return f"added token {content!r} contains whitespace"
        if normalizer is None or not added.get("normalized"):
            continue
        form = normalizer.normalize_str(content)
        if any(ch.isspace() or any(ch in mark for mark in marks.values()) for ch in form):
            return f"added token {content!r} normalizes to {form!r}, which a cut's whitespace may be part of"
        if any(mark == "" for mark in marks.values()):
            return f"the normalizer removes whitespace, across which added token {content!r} may match"
    return None


#: `_letters_removed` by normalizer description: once per map, not per tokenizer copy.
_removed: dict[str, str] = {}


def _letters_removed(description: str, normalizer: Any) -> str:
    """The letters and digits (up to 5) that `normalizer` (described by
    `description`) makes whitespace or nothing, which could leave a word
    with no token (a character map may). ~0.6 s: Unicode's 133,000 letters
    and digits, each alone."""
    if description not in _removed:
        letters = (chr(c) for c in range(sys.maxunicode + 1) if chr(c).isalnum())
        gone = (ch for ch in letters if not normalizer.normalize_str(ch).strip())
        _removed[description] = "".join(itertools.islice(gone, 5))
    return _removed[description]


def _between_letters(normalizer: Any, whitespace: str) -> str:
    """What `normalizer` makes of `whitespace` between two letters (`a`)."""
    if normalizer is None:
        return whitespace
    head = str(normalizer.normalize_str("a"))
    both = str(normalizer.normalize_str("a" + whitespace + "a"))
    return both[len(head) : -1] if both.startswith(head) and both.endswith("a") else both


def _every_word_gives_a_token(model: Mapping[str, Any], pre_tokenizer: Mapping[str, Any] | None) -> bool:
    """Whether every pre-token gives at least one token: the model has an
    unknown token (or byte fallback, or byte-level BPE's every byte), so
    that no character is dropped. What bounds the pieces tried
    (`_sure_piece`), and so the price of a truncated text."""
    kind = model.get("type")
    vocab = model.get("vocab")
    if model.get("byte_fallback"):
        return True
    if kind == "Unigram":
        return model.get("unk_id") is not None
    unk = model.get("unk_token")
    if isinstance(vocab, dict) and unk is not None and unk in vocab:
        return True
    if kind != "BPE" or not isinstance(vocab, dict) or not _byte_level(pre_tokenizer):
        return False
    from tokenizers.pre_tokenizers import ByteLevel

    return set(ByteLevel.alphabet()) <= vocab.keys()


def _byte_level(part: Mapping[str, Any] | None) -> bool:
    if part is None:
        return False
    if part.get("type") == "Sequence":
        return any(_byte_level(item) for item in part.get("pretokenizers") or ())
    return part.get("type") == "ByteLevel"


@dataclass(frozen=True)
class Plan:
    """How one tokenizer is tokenized by prefix, or `reason` why it is not."""

    reason: str | None


_plans: weakref.WeakKeyDictionary[Any, Plan] = weakref.WeakKeyDictionary()


_plans_lock = threading.Lock()


_logged: set[tuple[str, str | None]] = set()


logger = logging.getLogger("vllm.offload_vllm")


def _announce(tokenizer: Any, found: Plan) -> None:
    """Say once per process and kind of tokenizer whether truncated texts are tokenized by prefix."""
    key = (type(tokenizer).__name__, found.reason)
    if key in _logged:
        return
    _logged.add(key)
    if found.reason is None:
        logger.info("offload-vllm: prefix tokenization on for %s", key[0])
    else:
        logger.info("offload-vllm: prefix tokenization off for %s (%s): whole texts are tokenized", key[0], found.reason)


def plan(tokenizer: Any) -> Plan:
    """`tokenizer`'s plan, checked once per tokenizer object."""
    try:
        found = _plans.get(tokenizer)
    except TypeError:  # not weakly referenceable: check each time
        return Plan(unsound_because(tokenizer))
    if found is None:
        found = Plan(unsound_because(tokenizer))
        with _plans_lock:
            _plans[tokenizer] = found
            _announce(tokenizer, found)
    return found


_POST_PROCESSORS = {"TemplateProcessing", "BertProcessing", "RobertaProcessing", "ByteLevel"}


def _pair_unsound_because(tokenizer: Any) -> str | None:
    """Why the pair path could give other ids than vLLM's whole pair with
    `tokenizer` (beyond `unsound_because`), or `None`: a post-processor
    whose special tokens depend on the text, or a normalizer that makes an
    ASCII character more than three bytes (`_may_outgrow`)."""
    backend = tokenizer.backend_tokenizer
    spec = json.loads(backend.to_str())
    processor = spec.get("post_processor")
    parts = [] if processor is None else processor.get("processors", [processor])
    unknown = [p.get("type") for p in parts if p.get("type") not in _POST_PROCESSORS]
    if unknown:
        return f"post-processor {unknown[0]!r} is not one known to add the same special tokens to any pair"
    normalizer = backend.normalizer
    if normalizer is not None:
        wide = [chr(c) for c in range(128) if len(normalizer.normalize_str(chr(c)).encode()) > 3]
        if wide:
            return f"the normalizer makes {wide[0]!r} more than three bytes"
    return None


_pair_plans: weakref.WeakKeyDictionary[Any, Plan] = weakref.WeakKeyDictionary()


def pair_plan(tokenizer: Any) -> Plan:
    """`tokenizer`'s plan for pairs (`plan`, then `_pair_unsound_because`), checked once per tokenizer object."""
    single = plan(tokenizer)
    if single.reason is not None:
        return single
    try:
        found = _pair_plans.get(tokenizer)
    except TypeError:
        return Plan(_pair_unsound_because(tokenizer))
    if found is None:
        found = Plan(_pair_unsound_because(tokenizer))
        with _plans_lock:
            _pair_plans[tokenizer] = found
    return found
