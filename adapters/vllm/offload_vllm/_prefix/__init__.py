"""Prefix tokenization: tokenize only as much of a truncated text as its kept tokens need.

vLLM tokenizes a whole text and then keeps `truncate_prompt_tokens` of its tokens
(or the model's length); this tokenizes a prefix of the text (a suffix when
truncating on the left) long enough to hold them, growing it (at least doubling)
when it is not, and gives exactly what whole-text tokenization gives once vLLM's
truncation is applied to both.

**Why a prefix gives the same tokens.** A Hugging Face fast tokenizer
normalizes the text, splits it into pre-tokens ("words"), tokenizes each
pre-token on its own, then adds special tokens. The prefix is cut at a *safe
cut*: between a letter or digit (`str.isalnum`, but the few in
`GRAPHEME_JOINED`) and an ASCII whitespace character (a suffix starts at such
a point, after the whitespace): always a grapheme cluster boundary. For the
normalizers and pre-tokenizers in `_NORMALIZERS` and `_PRE_TOKENIZERS`:

- normalization is per character, or Unicode normalization, which an ASCII
  whitespace character (a starter that never composes) cannot join across, or a
  replacement of one character or of a run of spaces, which a letter or digit
  ends, or SentencePiece's character map (`Precompiled`, XLM-R's), which
  rewrites each grapheme cluster on its own (the tokenizers library's
  `Precompiled::normalize`): so the prefix normalizes to the start of what
  the whole text does, up to its last pre-token;
- pre-tokenization splits on whitespace, on punctuation, on digits or by the
  GPT-2 pattern (whose matches end where a class of characters does, or one
  whitespace character before a non-whitespace one): every pre-token of the
  prefix but its last is a pre-token of the whole text (of a suffix, every one
  but its first, which may carry a prepended space or `▁`);
- so every token from those pre-tokens is the whole text's token, in order.

The tokens kept are taken only from those pre-tokens ("stable" tokens: their
word index, `BatchEncoding.word_ids`, is below the prefix's last, above a
suffix's first), and the prefix is grown until one more stable token than vLLM
can keep exists, so that truncation of the prefix's tokens and of the text's
takes the same branch and the same tokens.

**What it costs, at most** (`_pieces`, `read_bound`). The pieces tried end
at safe cuts, each at least twice as long as the one before, the first at
a first guess of characters per token, none past a third of the text nor
past `_WINDOW` first guesses; they stop at the *sure piece*, the one that
ends past `keep + 2` letters or digits each followed by whitespace, which
holds enough stable tokens because every pre-token gives a token
(`_every_word_gives_a_token`). When the pieces run out, the whole text is
tokenized. So the characters handed to the tokenizer are at most the
text's length for the pieces plus the text once: **at most twice
whole-text tokenization, whatever the text**, in a few calls; and exactly
`read_bound` in the worst case, which a truncated text is priced by
(`_cost.py`) and which the pieces, taken from the priced count, never pass.
A text the tokenizer refuses (a lone surrogate) is tokenized whole, so that
it is refused as vLLM refuses it.

**Where it is not used** (whole-text tokenization, as vLLM does): a slow
(Python) tokenizer, or one whose backend is not the tokenizers library's; a
normalizer, pre-tokenizer or model not known above (such as a `Split`
pattern, BPE dropout), or a character map that makes a letter or digit
whitespace or nothing; a model that may give a word no token (no unknown token, no byte
fallback); an added token containing whitespace, or matched on the
normalized text by a form that holds what a cut's whitespace normalizes to
(or with a normalizer that removes that whitespace); special tokens anywhere
but before and after the text; a text with no safe cut. Each tokenizer is
checked once (`plan`); a text is checked as it is tokenized.

**Text pairs** (a cross-encoder's query and document, `encode_pair_truncated`)
are cut by the same argument applied to the document (`_pairs`).

The map (one module each): `_plan`: whether a tokenizer is one this is sound
for (`plan`, `pair_plan`). `_cuts`: safe cuts and the pieces tried.
`_reads`: the characters read at most (`read_bound`, `pair_read_bound`, `pair_read_bounds`),
which pricing uses. `_texts`: single texts (`encode_truncated`). `_pairs`:
text pairs (`encode_pair_truncated`).
"""

from __future__ import annotations

from ._cuts import GRAPHEME_JOINED as GRAPHEME_JOINED
from ._cuts import Side as Side
from ._pairs import encode_pair_truncated as encode_pair_truncated
from ._plan import Plan as Plan
from ._plan import logger as logger
from ._plan import pair_plan as pair_plan
from ._plan import plan as plan
from ._plan import unsound_because as unsound_because
from ._reads import pair_read_bound as pair_read_bound
from ._reads import pair_read_bounds as pair_read_bounds
from ._reads import read_bound as read_bound
from ._texts import encode_truncated as encode_truncated
