"""Scratch research harness for LoCoMo retrieval (not product code)."""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field

import bm25s
import numpy as np
import Stemmer

DATA = "/work/shared/datasets/locomo-dev"
STEM = Stemmer.Stemmer("english")

_WL = None


def wl():
    global _WL
    if _WL is None:
        import wordllama
        from wordllama import WordLlama
        _WL = WordLlama.load(config="l2_supercat", dim=256,
                             cache_dir=os.path.dirname(wordllama.__file__), disable_download=True)
    return _WL


def embed(texts):
    v = np.asarray(wl().embed(list(texts)), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True) + 1e-9
    return v


def norm_evidence(ev):
    out = []
    for e in ev:
        for part in re.split(r"[;,\s]+", e):
            m = re.fullmatch(r"D:?(\d+):(\d+)", part.strip())
            if m:
                out.append(f"D{int(m.group(1))}:{int(m.group(2))}")
    return list(dict.fromkeys(out))


def load(data=DATA):
    convs = []
    for f in sorted(glob.glob(os.path.join(data, "*.json"))):
        d = json.load(open(f))
        d = d.get("conversation", d) if "qa" not in d else {**d.get("conversation", {}), **d}
        turns = []
        snums = sorted(int(k.split("_")[1]) for k in d if re.fullmatch(r"session_\d+", k))
        for s in snums:
            date = d.get(f"session_{s}_date_time", "")
            for t in d[f"session_{s}"]:
                turns.append(dict(speaker=t["speaker"], dia_id=t["dia_id"], text=t["text"],
                                  caption=t.get("blip_caption", ""), query=t.get("query", ""),
                                  session=s, date=date))
        qs = []
        for q in d["qa"]:
            if q["category"] not in (1, 2, 3, 4):
                continue
            ev = norm_evidence(q.get("evidence", []))
            if not ev:
                continue
            qs.append(dict(q=q["question"], ev=ev, cat=q["category"]))
        convs.append(dict(name=os.path.basename(f), turns=turns, qs=qs,
                          speakers=[d["speaker_a"], d["speaker_b"]]))
    return convs


def short_date(date):
    # "1:56 pm on 8 May, 2023" -> "8 May 2023"
    m = re.search(r"on (\d+ \w+),? (\d{4})", date)
    return f"{m.group(1)} {m.group(2)}" if m else date


def turn_text(t, speaker=True, date=False, caption=True, query=False):
    s = t["text"]
    if speaker:
        s = f"{t['speaker']}: {s}"
    if caption and t["caption"]:
        s += f" [shares {t['caption']}]"
    if query and t["query"]:
        s += f" [{t['query']}]"
    if date:
        s = f"[{short_date(t['date'])}] " + s
    return s
