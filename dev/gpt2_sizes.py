"""GPT-2's published sizes d12..d48 as train_gpt.cu's descriptor table has them
(the one place they are written): {"d12": (L, NH, C), ...}, NH = C / 64 as
train_gpt.cu derives it. Read from the source, so the Python tools cannot
drift from the trainer."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gpt2_descriptors(source=os.path.join(ROOT, "train_gpt.cu")):
    text = open(source).read()
    rows = re.findall(r'\{"(d\d+)",\s*(\d+),\s*(\d+)\}', text)
    if not rows or "s.L, s.C / 64, s.C}" not in text:
        raise RuntimeError(f"{source}: GPT-2's d12..d48 table (or its NH = C / 64) not found; update dev/gpt2_sizes.py")
    return {name: (int(L), int(C) // 64, int(C)) for name, L, C in rows}
