"""Deterministic multilingual test corpus for the tokenizer (generated, never committed).

Mixes English prose, code, JSON, Chinese, Japanese, Korean, Arabic, emoji, digit runs and
whitespace oddities (tabs, CRLF, NBSP, U+3000, U+2028, U+0085, long runs), plus added-token
spellings and fragments of them. The same seed always gives the same documents.
"""
import json
import random
import unicodedata

EN_WORDS = """the of and to in is was for on that with as by it at from his her an be this have
are not or had but which were their one all there been has would when who will more no if out so
said what up its about into than them can only other new some could time these two may first then
do any like my now over such our man me even most made after also did many before must through
years where much your way well down should because each just those people how too little state
good very make world still own see men work long get here between both life being under never day
same another know while last might us great old year off come since against go came right used
take three Don't I'm it's you'll they've we'd isn't O'Brien e-mail co-operate naïve café résumé
Zürich façade""".split()

CODE_SNIPPETS = [
    "def {f}({a}, {b}=None):\n    \"\"\"{doc}\"\"\"\n    if {a} is None:\n        return []\n"
    "    return [{b} * i for i in range(len({a}))]\n",
    "for (int {a} = 0; {a} < {n}; ++{a}) {{\n\t{b}[{a}] += {a} * 0x{h};\n}}\n",
    "const {f} = async ({a}) => {{\n  const res = await fetch(`/api/{b}?id=${{{a}}}`);\n"
    "  return res.json();\n}};\n",
    "#include <vector>\nstd::vector<int> {f}(const std::vector<int>& {a}) {{ return {a}; }}\n",
    "SELECT {a}, COUNT(*) FROM {b} WHERE {a} >= {n} GROUP BY {a};\r\n",
    "    {a}_{b} = self.{f}({n}) if {a} != '{doc}' else {{\"{b}\": [{n}, {n}.5]}}\n",
    "<div class=\"{a}\"><a href=\"https://example.com/{b}/{n}.html\">{doc}</a></div>\n",
    "fn {f}<'a>({a}: &'a str) -> Result<u{n}, Box<dyn Error>> {{ Ok({a}.len() as u{n}) }}\n",
    "$ {a} --{b}={n} | grep -E '^[a-z_]+$' >> /tmp/{f}.log 2>&1 && echo \"ok\"\n",
]

HIRAGANA = "".join(chr(c) for c in range(0x3041, 0x3097))
KATAKANA = "".join(chr(c) for c in range(0x30A1, 0x30FB)) + "ー"
HALF_KATAKANA = "".join(chr(c) for c in range(0xFF66, 0xFF9E))
CJK_PUNCT = "，。！？、；：「」『』（）《》【】…—・"
EMOJI = ["😀", "🦀", "🚀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "❤️", "✨", "🐦‍🔥", "🔥",
         "😂", "🤖", "⭐", "☕", "1️⃣", "🧑🏿‍💻", "🙇‍♀️", "🎉"]
SPACES = [" ", "  ", "\t", "\t\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2028", "\u2029",
          "\u0085", "\u200b", "\u180e", "\ufeff", "\u2009", "\u202f", "\x0b", "\x0c", "\x1c",
          " \n", "\n ", " \t\n", "\r", "\u205f"]
SPECIALS = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜",
            "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", "<｜System｜>",
            "<｜deepseek_image｜>", "<|EOT|>", "<｜place▁holder▁no▁7｜>", "<｜Use", "｜DSM",
            "<think", "<｜DSML｜ calls>", "<|place_holder_mm_span_0100|>", "<｜▁pad▁｜>"]
DIGIT_EXTRA = "０１２３４５６７８９²³¹①②③ⅫⅣ٠١٢٣٤٥٦٧٨٩۱۲۳४५६"
# Blocks whose assigned characters are the same in Unicode 14 (PCRE2 10.42's tables) and 15
# (Oniguruma's in HF tokenizers 0.22): random picks from them exercise \p{L}/\p{M}/\p{P}/\p{S}/\p{N}.
RANDOM_BLOCKS = [(0x00A0, 0x024F), (0x0370, 0x03FF), (0x0400, 0x04FF), (0x0590, 0x05FF),
                 (0x0900, 0x097F), (0x0E00, 0x0E7F), (0x1E00, 0x1EFF), (0x2000, 0x206F),
                 (0x2100, 0x22FF), (0x2500, 0x25FF), (0x3400, 0x4DBF), (0x9FA0, 0x9FFF),
                 (0xF900, 0xFAFF), (0xFF00, 0xFFEF), (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF)]


def _word(r):
    return "".join(r.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(r.randint(1, 10)))


def english(r):
    out = []
    for _ in range(r.randint(5, 60)):
        w = r.choice(EN_WORDS)
        if r.random() < 0.1:
            w = w.capitalize()
        if r.random() < 0.03:
            w = w.upper()
        out.append(w)
        if r.random() < 0.08:
            out[-1] += r.choice([",", ".", ";", ":", "!", "?", "...", "'s", ")", "\"", "—"])
    return " ".join(out) + r.choice([". ", ".\n", "\n\n", "? ", "! "])


def code(r):
    s = r.choice(CODE_SNIPPETS).format(
        f=_word(r), a=_word(r), b=_word(r), n=r.randint(0, 99999), h="%x" % r.getrandbits(24),
        doc=english(r).strip()[:40].replace('"', "'"))
    if r.random() < 0.2:
        s = s.replace("    ", "\t")
    return s


def json_text(r):
    def value(depth):
        k = r.random()
        if depth > 3 or k < 0.3:
            return r.choice([r.randint(-10**6, 10**6), r.random() * 100, True, None,
                             english(r)[:30], chinese(r)[:10], r.choice(EMOJI)])
        if k < 0.65:
            return {_word(r): value(depth + 1) for _ in range(r.randint(1, 5))}
        return [value(depth + 1) for _ in range(r.randint(0, 4))]
    return json.dumps(value(0), ensure_ascii=r.random() < 0.3,
                      indent=r.choice([None, 2, 4])) + "\n"


def chinese(r):
    out = []
    for _ in range(r.randint(3, 80)):
        c = r.random()
        if c < 0.85:
            out.append(chr(r.randint(0x4E00, 0x9FFF)))
        elif c < 0.95:
            out.append(r.choice(CJK_PUNCT))
        else:
            out.append(str(r.randint(0, 2030)))
    return "".join(out)


def japanese(r):
    out = []
    for _ in range(r.randint(3, 60)):
        c = r.random()
        if c < 0.4:
            out.append(r.choice(HIRAGANA))
        elif c < 0.65:
            out.append(r.choice(KATAKANA))
        elif c < 0.85:
            out.append(chr(r.randint(0x4E00, 0x9FA5)))
        elif c < 0.93:
            out.append(r.choice(HALF_KATAKANA))
        else:
            out.append(r.choice(CJK_PUNCT))
    return "".join(out)


def korean(r):
    words = ["".join(chr(r.randint(0xAC00, 0xD7A3)) for _ in range(r.randint(1, 5)))
             for _ in range(r.randint(2, 20))]
    return " ".join(words) + r.choice([".", "?", "!", "\n", " "])


def arabic(r):
    words = []
    for _ in range(r.randint(2, 20)):
        w = "".join(chr(r.randint(0x0621, 0x064A)) for _ in range(r.randint(1, 7)))
        if r.random() < 0.3:
            w += chr(r.randint(0x064B, 0x0652))
        if r.random() < 0.1:
            w = "".join(chr(0x0660 + int(d)) for d in str(r.randint(0, 9999)))
        words.append(w)
    return " ".join(words) + r.choice(["، ", ". ", "؟\n"])


def emoji(r):
    return "".join(r.choice(EMOJI) + r.choice(["", "", " ", "\u200d"])
                   for _ in range(r.randint(1, 12)))


def digits(r):
    c = r.random()
    if c < 0.5:
        return "".join(r.choice("0123456789") for _ in range(r.randint(1, 40)))
    if c < 0.7:
        return "%d.%0*d" % (r.randint(0, 10**9), r.randint(1, 6), r.randint(0, 999))
    if c < 0.85:
        return ",".join(str(r.randint(0, 999)) for _ in range(r.randint(1, 6)))
    return "".join(r.choice(DIGIT_EXTRA) for _ in range(r.randint(1, 12)))


def whitespace(r):
    c = r.random()
    if c < 0.15:
        return r.choice([" ", "\n", "\t", "\r\n", "\u3000", "\u00a0"]) * r.randint(20, 3000)
    return "".join(r.choice(SPACES) for _ in range(r.randint(1, 8)))


def special(r):
    return r.choice(SPECIALS)


def random_unicode(r):
    out = []
    while len(out) < r.randint(1, 30):
        lo, hi = r.choice(RANDOM_BLOCKS)
        ch = chr(r.randint(lo, hi))
        if unicodedata.category(ch) not in ("Cn", "Cs", "Co"):
            out.append(ch)
    return "".join(out)


GENERATORS = [(english, 30), (code, 15), (json_text, 8), (chinese, 10), (japanese, 6),
              (korean, 4), (arabic, 4), (emoji, 4), (digits, 6), (whitespace, 8), (special, 3),
              (random_unicode, 4)]


def documents(total_bytes, seed=20261129):
    """Documents of 1 B to ~200 KB whose UTF-8 sizes add up to at least total_bytes."""
    r = random.Random(seed)
    gens = [g for g, w in GENERATORS for _ in range(w)]
    docs, size = [], 0
    while size < total_bytes:
        k = r.random()
        target = (r.randint(1, 50) if k < 0.3 else r.randint(50, 2000) if k < 0.7 else
                  r.randint(2000, 20000) if k < 0.9 else r.randint(20000, 200000))
        parts, n = [], 0
        while n < target:
            s = r.choice(gens)(r)
            if r.random() < 0.3:
                s += r.choice(SPACES)
            parts.append(s)
            n += len(s.encode())
        doc = "".join(parts)
        docs.append(doc)
        size += len(doc.encode())
    return docs


def slices(docs, count, seed=7):
    """Random short slices of the documents: cuts at arbitrary characters hit piece boundaries
    that whole documents rarely do."""
    r = random.Random(seed)
    out = []
    for _ in range(count):
        d = r.choice(docs)
        i = r.randrange(len(d))
        out.append(d[i:i + r.randint(1, 300)])
    return out
