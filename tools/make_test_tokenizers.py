#!/usr/bin/env python3
"""Trains the small tokenizers in tests/tokenizers/ that the C++ tokenizer is checked against.

They have the shapes real checkpoints ship, with small vocabularies so the files stay small:
  gpt2.json         GPT-2: ByteLevel pre-tokenizer with its own regex, merges saved as "a b" strings, an
                    <|endoftext|> special token and two added tokens with single_word / lstrip / rstrip flags.
  roberta.json      ByteLevel with add_prefix_space, RobertaProcessing (<s> A </s>), <mask> with lstrip.
  llama3.json       Llama-3: Split(Llama-3 regex, Isolated) + ByteLevel(use_regex=false), ignore_merges=true,
                    merges saved as ["a","b"] pairs, <|begin_of_text|> & co., post-processor
                    Sequence[ByteLevel, TemplateProcessing("<|begin_of_text|> $A")], and whole words added to the
                    vocab without merges (what ignore_merges is for).
  llama3_merges.json  the same with ignore_merges=false and merges saved as "a b" strings.
  llama2.json       sentencepiece-style BPE in tokenizer.json (Llama-2 / Mistral): Prepend+Replace normalizer,
                    byte_fallback with <0xNN> tokens, <unk> fused, Replace/ByteFallback/Fuse/Strip decoder.
  mistral.json      the same model with a Metaspace pre-tokenizer (prepend_scheme first) and Metaspace decoder.
  o200k.json        GPT-4o / Phi-4-mini: Split(o200k_base's case-aware regex, Isolated) + ByteLevel(use_regex=false),
                    the pre-tokenizer of microsoft/Phi-4-mini-flash-reasoning's tokenizer.json (Xenova/gpt-4o),
                    <|endoftext|> and chat special tokens.
  regex_mix.json    Split with every behavior, invert, \\w / \\s / \\p{N} classes, ByteLevel add_prefix_space.
  sp.model          a sentencepiece BPE model with byte fallback (Llama-2 tokenizer.model style), trained with
                    the `sentencepiece` package.
Run: python3 tools/make_test_tokenizers.py [OUT_DIR]   (default tests/tokenizers). Deterministic for a given
version of the packages; the committed files are the reference, this script is how they were made.
"""
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# tiktoken's o200k_base pattern (openai/tiktoken, tiktoken_ext/openai_public.py): upper-case runs and words split
# apart, contractions folded into the word, "/" and line breaks kept after punctuation.
O200K_REGEX = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

WORDS = ("the of and to in is was that for it with as his on be at by had are but from or have an they which one "
         "you were her all she there would their we him been has when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now such like "
         "our over man me even most made after also did many before must through back years where much your way "
         "well down should because each just those people Mr how too little state good very make world still own "
         "see men work long get here between both life being under never day same another know while last might "
         "us great old year off come since against go came right used take three tokenizer attention differential "
         "model layer head softmax lambda query key value weight gradient transformer sequence").split()
ACCENTED = "café naïve résumé über straße façade jalapeño déjà vu Ångström crème brûlée São Paulo Kraków Łódź".split()
CJK = ["注意力机制", "模型", "東京都", "日本語のテキスト", "한국어 문장", "深度学习", "分词器", "こんにちは世界"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🧑🏿‍💻", "✨", "🚀"]
CODE = ["def f(x):\n    return x + 1\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
        "if x != None and y >= 3:\n", "std::vector<int> v{1, 2, 3};", "#include <stdio.h>\n", "x = {'a': [1, 2]}"]


def corpus(seed, n_lines):
    rnd = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        parts = []
        for _ in range(rnd.randint(3, 25)):
            r = rnd.random()
            if r < 0.62:
                w = rnd.choice(WORDS)
                parts.append(w.capitalize() if rnd.random() < 0.15 else w.upper() if rnd.random() < 0.02 else w)
            elif r < 0.70:
                parts.append(rnd.choice(ACCENTED))
            elif r < 0.76:
                parts.append(rnd.choice(CJK))
            elif r < 0.80:
                parts.append(rnd.choice(EMOJI))
            elif r < 0.86:
                parts.append(str(rnd.randint(0, 10 ** rnd.randint(1, 7))))
            elif r < 0.90:
                parts.append(rnd.choice(CODE))
            elif r < 0.95:
                parts.append(rnd.choice(["it's", "don't", "I'll", "we've", "they're", "I'm", "he'd", "IT'S"]))
            else:
                parts.append(rnd.choice([",", ".", "!", "?", ";", ":", "--", "...", "(", ")", "\"", "'"]))
        lines.append(" ".join(parts))
    return lines


def byte_level_trainer(vocab_size, special):
    return trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=special, show_progress=False,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def save(tok, path, merges_as_strings=False):
    """Saves compactly, merges either in the legacy "a b" form or as ["a", "b"] pairs."""
    data = json.loads(tok.to_str())
    model = data["model"]
    if merges_as_strings:
        model["merges"] = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model["merges"]]
    else:
        model["merges"] = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    back = Tokenizer.from_str(text)  # must load back in the reference implementation, with the same ids
    assert all(back.token_to_id(t["content"]) == t["id"] for t in data["added_tokens"]), path
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {path} ({len(text.encode())} bytes)")


def bytelevel_words(words):
    table = {}
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, map(chr, cs)))
    return ["".join(table[b] for b in w.encode()) for w in words]


def make_gpt2(out, lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(lines, byte_level_trainer(2000, ["<|endoftext|>"]))
    tok.add_tokens([AddedToken("[WORD]", single_word=True, normalized=False),
                    AddedToken("<tool>", lstrip=True, rstrip=True, normalized=True)])
    save(tok, os.path.join(out, "gpt2.json"), merges_as_strings=True)


def make_roberta(out, lines):
    special = ["<s>", "<pad>", "</s>", "<unk>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, byte_level_trainer(1000, special))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                      ("<s>", tok.token_to_id("<s>")), trim_offsets=True)
    save(tok, os.path.join(out, "roberta.json"))


def make_llama3(out, lines):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, byte_level_trainer(3000, []))
    # Whole words in the vocab that merges would not build: with ignore_merges they come out as one token.
    extra = bytelevel_words([" differential", " tokenizer", " attention", "ization", " über", " 注意力机制",
                             " Hello", "Hello", " world", "   ", "\n\n", " 123", "👍🏽"])
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for w in extra:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer.from_str(json.dumps(data))
    special = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
               "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    save(tok, os.path.join(out, "llama3.json"))
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = False
    save(Tokenizer.from_str(json.dumps(data)), os.path.join(out, "llama3_merges.json"), merges_as_strings=True)


def make_o200k(out, lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines + ["HTTPServer's URLParser isn't XMLHttpRequest; I'LL say WE'RE OK/fine.\n"],
                            byte_level_trainer(3000, []))
    special = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    save(tok, os.path.join(out, "o200k.json"), merges_as_strings=True)


def make_llama2(out, lines):
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    trainer = trainers.BpeTrainer(vocab_size=900, min_frequency=2, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
                                  limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(["▁" + l.replace(" ", "▁") for l in lines], trainer)
    data = json.loads(tok.to_str())
    # As in Llama-2's file: the byte tokens are model vocab entries, not added tokens.
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in ("<unk>", "<s>", "</s>")]
    for t in data["added_tokens"]:
        t["normalized"] = False
    bos = data["model"]["vocab"]["<s>"]
    data["post_processor"] = json.loads(processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]).__getstate__())
    tok = Tokenizer.from_str(json.dumps(data))
    save(tok, os.path.join(out, "llama2.json"))


def make_regex_mix(out, lines):
    """Split behaviors and Oniguruma classes (\\w, \\s, \\p{N}) that the two real styles do not use."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\w+|[^\w\s]+"), behavior="removed", invert=True),
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="contiguous"),
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Split(".", behavior="merged_with_next"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, byte_level_trainer(700, ["<|endoftext|>"]))
    save(tok, os.path.join(out, "regex_mix.json"))


def make_mistral(out, lines):
    """Metaspace pre-tokenizer (prepend_scheme first, no split) and decoder, byte fallback: Mistral-7B's shape."""
    data = json.loads(open(os.path.join(out, "llama2.json"), encoding="utf-8").read())
    data["normalizer"] = None
    data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    data["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    save(Tokenizer.from_str(json.dumps(data)), os.path.join(out, "mistral.json"))


def make_sentencepiece(out, lines):
    try:
        import sentencepiece as spm
    except ImportError:
        sys.exit("make_test_tokenizers: the `sentencepiece` package is missing (pip install sentencepiece)")
    import io
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=600,
                                   model_type="bpe", byte_fallback=True, character_coverage=0.995,
                                   split_digits=True, num_threads=1, minloglevel=2,
                                   normalization_rule_name="identity", add_dummy_prefix=True)
    path = os.path.join(out, "sp.model")
    with open(path, "wb") as f:
        f.write(model.getvalue())
    print(f"wrote {path} ({len(model.getvalue())} bytes)")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "tokenizers")
    os.makedirs(out, exist_ok=True)
    lines = corpus(1234, 6000)
    make_gpt2(out, lines)
    make_roberta(out, lines)
    make_llama3(out, lines)
    make_o200k(out, lines)
    make_llama2(out, lines)
    make_mistral(out, lines)
    make_regex_mix(out, lines)
    make_sentencepiece(out, lines)


if __name__ == "__main__":
    main()
