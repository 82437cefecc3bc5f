"""A generated corpus of varied strings for tokenizer tests and benchmarks."""
from __future__ import annotations

import random

FRAGMENTS = [
    # English, contractions in every case, curly apostrophes
    "Hello world", "don't", "DON'T", "we'll", "They'RE", "I'm", "you've", "she'd", "it's", "IT'S",
    "o'clock", "rock 'n' roll", "’s curly", "don’t", "Ma'am", "y'all'd've",
    # accents, combining marks, ligatures, titlecase
    "café", "cafe\u0301", "naïve", "Ǆemal ǅemal", "ﬁnal ﬂow", "Straße", "İstanbul", "ſtate", "e\u0301\u0302\u0303",
    # scripts
    "Привет, мир!", "Ελληνικά κείμενα", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "क्षत्रिय",
    "สวัสดีครับ", "日本語のテキスト", "中文字符测试", "한국어 텍스트", "カタカナ ひらがな", "ქართული",
    "Հայերեն", "தமிழ்", "ગુજરાતી", "བོད་ཡིག", "ᓀᐦᐃᔭᐍᐏᐣ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𓀀𓀁𓀂", "Ⅻ Ⅳ ⅷ",
    # emoji, ZWJ sequences, skin tones, flags, keycaps
    "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵🇺🇸", "1️⃣", "🚀✨🔥", "❤️", "🫠🪿",
    # numbers
    "1234567890", "3.14159", "1,000,000", "٠١٢٣٤٥", "１２３", "0x1F600", "1e-10", "²³¹", "½¾",
    "99999999999999999999", "v1.2.3-rc4",
    # code
    "def f(x):\n    return x ** 2  # square\n", "int main(void) { return 0; }",
    '{"key": [1, 2, {"a": null}]}', "<div class=\"x\">&amp;</div>", "SELECT * FROM t WHERE a='b';",
    "for (i = 0; i < n; ++i) {\n\tsum += a[i];\n}", "https://example.com/path?q=1&r=2#frag",
    "C:\\Users\\name\\file.txt", "/usr/local/bin//", "a->b::c", "$x = @y % ^z;", "```python\nprint()\n```",
    # whitespace
    " ", "  ", "\t", "\n", "\r\n", "\n\n\n", "   \n  ", "\u00a0", "\u3000", "\u2028", "\u200b", " \t \n \r ",
    # punctuation and symbols
    "!!!", "...", "?!", "—", "«»", "„“", "§¶", "©®™", "∑∫√∞", "←→↑↓", "♠♣♥♦", "\ufeff", "\ufffd",
    # special-token strings
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|endoftext|>",
    "<|startoftext|>", "<|constrain|>", "<|endofprompt|>", "<|reserved_200500|>", "<|reserved_200013|>",
    "<|start", "|>", "<|", "<|start|><|start|>",
]
SEPARATORS = ["", " ", "  ", "\n", "\t", ", ", ". ", "\r\n", "'", "-", "_", "/"]


def corpus(n: int = 6000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 10
        if kind < 6:  # mixtures of fragments
            parts = [rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12))]
            s = "".join(p + rng.choice(SEPARATORS) for p in parts)
        elif kind == 6:  # long runs
            unit = rng.choice([" ", "\n", "\t", "0", "9", "a", "!", "-", "=", "ab", " \n", "👍", "é", "\u0301"])
            s = rng.choice(["", "x", " y"]) + unit * rng.randint(20, 400) + rng.choice(["", "z", "!", " "])
        elif kind == 7:  # random code points from the BMP and beyond
            s = "".join(chr(_random_code_point(rng)) for _ in range(rng.randint(1, 40)))
        elif kind == 8:  # random ASCII
            s = "".join(chr(rng.randint(9, 126)) for _ in range(rng.randint(1, 80)))
        else:  # digits and letters interleaved
            s = "".join(rng.choice(["1", "22", "333", "4444", "a", "B", "é", " ", "'s", "'LL"])
                        for _ in range(rng.randint(1, 30)))
        out.append(s)
    return out


def _random_code_point(rng: random.Random) -> int:
    while True:
        c = rng.choice([rng.randint(0x20, 0x2FF), rng.randint(0x300, 0x36F), rng.randint(0x370, 0x2FFF),
                        rng.randint(0x3000, 0xD7FF), rng.randint(0xE000, 0xFFFF),
                        rng.randint(0x10000, 0x1FFFF), rng.randint(0x20000, 0x10FFFF)])
        if not 0xD800 <= c <= 0xDFFF:
            return c
