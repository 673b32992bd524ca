"""LoCoMo retrieval research: turn-level recall@k with only the embedded defaults.

    python benchmarks/locomo_research.py [--data DIR] [--quick]

Signals allowed: BM25 (bm25s + PyStemmer) and WordLlama 256d (l2_supercat) embeddings, numpy.
No LLM, no other model, no network.

Protocol: per conversation, index its turns; ask every category 1-4 question within that
conversation; recall@k = fraction of the question's evidence dia_ids among the first k
distinct turns; macro average over questions; overall and per category.

Evidence normalisation (documented):
  * an evidence string may hold several ids ("D8:6; D9:17") -> split on ; , and whitespace;
  * "D:11:26" -> "D11:26" (stray colon after D); leading zeros dropped;
  * a bare "D" (no numbers) is not an id and is dropped;
  * ids that are well-formed but absent from the conversation (e.g. "D10:19" in conv 42) are
    KEPT and count as missed;
  * questions left with no evidence at all (2 open-domain questions in conv 26) are skipped.

FINAL method (`build_index` + `rank_turns`, parameters = `Params()` defaults):
  index time, per turn i (sessions are contiguous runs of turns):
    own_i  = text [+ " [shares <blip_caption>]"] [+ " [<img query>]"], with every participant
             name removed (regex \bName('s)?\b, case-insensitive)
    ctx_i  = previous turn of the SAME session (text + caption, names removed), else ""
    dense  = WordLlama(ctx_i + " " + own_i), L2-normalised
    bm25   = bm25s lucene k1=1.2 b=0.3, English stopwords, PyStemmer english, over
             "[8 May 2023] " + ctx_i + " " + own_i
  query time:
    named  = participants whose name occurs in the query; q' = query with names removed
    s      = z(BM25(q')) + 1.0 * z(cos(WordLlama(q'), dense))        z = (x-mean)/std over turns
    s     += 0.35 * max(s[i-1], s[i+1])   (neighbours in the same session only, else 0)
    s     += 0.5  * z(best s of the turn's session)[session(i)]      (z over sessions)
    s     += 5.0  if exactly one participant is named and turn i was spoken by them
    return argsort(-s)  (argpartition for top-k)
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import bm25s
import numpy as np
import Stemmer

logging.getLogger("bm25s").setLevel(logging.WARNING)

KS = (1, 5, 10, 25)
CATS = (1, 2, 3, 4)
CAT_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-dom", 4: "single-hop"}

# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------


def norm_evidence(ev: list[str]) -> list[str]:
    out = []
    for e in ev:
        for part in re.split(r"[;,\s]+", e):
            m = re.fullmatch(r"D:?(\d+):(\d+)", part.strip())
            if m:
                out.append(f"D{int(m.group(1))}:{int(m.group(2))}")
    return list(dict.fromkeys(out))


def load_conversations(data_dir: str) -> list[dict]:
    convs = []
    for f in sorted(glob.glob(os.path.join(data_dir, "*.json"))):
        d = json.loads(Path(f).read_text())
        c = d.get("conversation", d)
        snums = sorted(int(k.split("_")[1]) for k in c if re.fullmatch(r"session_\d+", k))
        turns = []
        for s in snums:
            date = c.get(f"session_{s}_date_time", "")
            for t in c[f"session_{s}"]:
                turns.append(
                    dict(
                        speaker=t["speaker"],
                        dia_id=t["dia_id"],
                        text=t["text"],
                        caption=t.get("blip_caption", "") or "",
                        query=t.get("query", "") or "",
                        session=s,
                        date=date,
                    )
                )
        qs = []
        for q in d["qa"]:
            if q.get("category") not in CATS:
                continue
            ev = norm_evidence(q.get("evidence", []))
            if ev:
                qs.append(dict(q=q["question"], ev=ev, cat=q["category"]))
        convs.append(
            dict(
                name=os.path.basename(f),
                turns=turns,
                qs=qs,
                speakers=[c["speaker_a"], c["speaker_b"]],
            )
        )
    return convs


# --------------------------------------------------------------------------------------
# Embedding (cached in memory: every distinct text is embedded once per run)
# --------------------------------------------------------------------------------------

_WL = None
_EMB_CACHE: dict[str, np.ndarray] = {}


def wordllama_model():
    global _WL
    if _WL is None:
        import wordllama
        from wordllama import WordLlama

        _WL = WordLlama.load(
            config="l2_supercat",
            dim=256,
            cache_dir=os.path.dirname(wordllama.__file__),
            disable_download=True,
        )
    return _WL


def embed(texts: list[str]) -> np.ndarray:
    """L2-normalised WordLlama vectors (wl.embed is NOT normalised)."""
    todo = [t for t in dict.fromkeys(texts) if t not in _EMB_CACHE]
    if todo:
        v = np.asarray(wordllama_model().embed(todo), dtype=np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True) + 1e-9
        _EMB_CACHE.update(zip(todo, v, strict=False))
    return np.stack([_EMB_CACHE[t] for t in texts])


# --------------------------------------------------------------------------------------
# Method
# --------------------------------------------------------------------------------------

STEMMER = Stemmer.Stemmer("english")


@dataclass(frozen=True)
class Params:
    # --- index-time text ---
    speaker_in_text: bool = False  # prefix "Name: " to the turn text (baseline habit)
    strip_names: bool = True  # remove participants' names from turn text and query
    caption: bool = True  # append "[shares <blip_caption>]"
    img_query: bool = True  # append the image search query field
    date_bm25: bool = True  # prefix "[8 May 2023]" to the BM25 text
    prev_ctx: bool = True  # document expansion: prepend previous turn (same session)
    next_ctx: bool = False  # ... and append next turn
    # --- BM25 ---
    method: str = "lucene"
    k1: float = 1.2
    b: float = 0.3
    stopwords: str | None = "en"
    stem: bool = True
    # --- scoring ---
    w_bm25: float = 1.0  # weight of z(BM25)
    w_dense: float = 1.0  # weight of z(cosine)
    fusion: str = "z"  # "z" (z-score blend), "minmax", "rrf"
    w_speaker: float = 5.0  # + w if the turn's speaker is the one participant named
    beta_nb: float = 0.35  # + beta * max(fused score of prev/next turn, same session)
    alpha_sess: float = 0.5  # + alpha * z(session score), session score = its best turn
    prf_docs: int = 0  # RM3-style PRF: #top turns used (0 = off)
    prf_terms: int = 10
    prf_weight: float = 0.5
    dense_prf: float = 0.0  # Rocchio on the query vector: q + a * mean(top-5 turn vecs)


@dataclass
class TurnIndex:
    turns: list[dict]
    params: Params
    names: list[str]
    session: np.ndarray
    bm25: bm25s.BM25
    doc_tokens: list[list[str]]
    vecs: np.ndarray
    speaker_lc: np.ndarray
    sess_ids: np.ndarray = field(default=None)


def _strip_names(s: str, names: list[str]) -> str:
    for n in names:
        s = re.sub(rf"\b{re.escape(n)}(?:'s|’s)?\b", " ", s, flags=re.I)
    return s


def _tokenize(texts: list[str], p: Params) -> list[list[str]]:
    return bm25s.tokenize(
        texts,
        stopwords=p.stopwords,
        stemmer=STEMMER if p.stem else None,
        return_ids=False,
        show_progress=False,
    )


def _short_date(date: str) -> str:
    m = re.search(r"(\d{1,2}) (\w+),? (\d{4})", date)  # "1:56 pm on 8 May, 2023" -> "8 May 2023"
    return f"{m.group(1)} {m.group(2)} {m.group(3)}" if m else date


def build_index(turns: list[dict], speakers: list[str], p: Params) -> TurnIndex:
    """Index one conversation (or one user's memory): a BM25 index and a matrix of vectors.

    Per turn i the *own text* is: text [+ " [shares <blip_caption>]"] [+ " [<img query>]"],
    with every participant name (and its possessive) removed.  If prev_ctx, the previous turn
    of the same session (own text without img query) is prepended; this is what is indexed,
    in BM25 additionally prefixed by the session date "[8 May 2023]".
    """
    names = list(speakers) if p.strip_names else []
    sess = np.array([t["session"] for t in turns])

    def own(t, with_query=p.img_query):
        s = t["text"]
        if p.speaker_in_text:
            s = f"{t['speaker']}: {s}"
        if p.caption and t["caption"]:
            s += f" [shares {t['caption']}]"
        if with_query and t["query"]:
            s += f" [{t['query']}]"
        return _strip_names(s, names) if names else s

    owns = [own(t) for t in turns]
    ctx_src = [own(t, with_query=False) for t in turns]
    n = len(turns)
    prev = [
        ctx_src[i - 1] if p.prev_ctx and i > 0 and sess[i - 1] == sess[i] else "" for i in range(n)
    ]
    nxt = [
        ctx_src[i + 1] if p.next_ctx and i + 1 < n and sess[i + 1] == sess[i] else ""
        for i in range(n)
    ]
    dense_txt = [
        " ".join(x for x in (a, o, c) if x) for a, o, c in zip(prev, owns, nxt, strict=False)
    ]
    bm_txt = [
        (f"[{_short_date(t['date'])}] " if p.date_bm25 else "") + d
        for t, d in zip(turns, dense_txt, strict=False)
    ]

    toks = _tokenize(bm_txt, p)
    bm = bm25s.BM25(method=p.method, k1=p.k1, b=p.b)
    bm.index(toks, show_progress=False)
    return TurnIndex(
        turns=turns,
        params=p,
        names=list(speakers),
        session=sess,
        bm25=bm,
        doc_tokens=toks,
        vecs=embed(dense_txt),
        speaker_lc=np.array([t["speaker"].lower() for t in turns]),
    )


def _bm25_scores(index: TurnIndex, toks: list[str], weights: dict[str, float] | None = None):
    vocab = index.bm25.vocab_dict
    toks = [t for t in toks if t in vocab]
    n = len(index.turns)
    if not toks:
        return np.zeros(n, np.float32)
    if weights is None:
        return index.bm25.get_scores(toks)
    s = np.zeros(n, np.float32)
    for t, w in weights.items():
        if t in vocab:
            s += w * index.bm25.get_scores([t])
    return s


def _z(x: np.ndarray) -> np.ndarray:
    return (x - x.mean()) / (x.std() + 1e-9)


def _minmax(x: np.ndarray) -> np.ndarray:
    return (x - x.min()) / (x.max() - x.min() + 1e-9)


def _rrf(x: np.ndarray, k: int = 60) -> np.ndarray:
    r = np.empty(len(x))
    r[np.argsort(-x, kind="stable")] = np.arange(len(x))
    return 1.0 / (k + r + 1)


def score_components(query: str, index: TurnIndex, qvec: np.ndarray | None = None) -> dict:
    """Raw per-turn signals for one query (all O(#turns) numpy work or BM25 postings)."""
    p = index.params
    q_lc = query.lower()
    named = [nm for nm in index.names if re.search(rf"\b{re.escape(nm.lower())}\b", q_lc)]
    q_txt = _strip_names(query, index.names) if p.strip_names else query
    q_toks = _tokenize([q_txt], p)[0]
    bm = _bm25_scores(index, q_toks)
    if qvec is None:
        qvec = embed([q_txt])[0]
    cos = index.vecs @ qvec
    # speaker prior: exactly one of the participants named in the question
    spk = np.zeros(len(index.turns), np.float32)
    if len(named) == 1 and len(named) < len(index.names):
        spk = (index.speaker_lc == named[0].lower()).astype(np.float32)
    return dict(bm=bm, cos=cos, spk=spk, q_toks=q_toks, qvec=qvec)


def _fuse(bm, cos, p: Params):
    if p.fusion == "rrf":
        return p.w_bm25 * _rrf(bm) + p.w_dense * _rrf(cos)
    f = _minmax if p.fusion == "minmax" else _z
    return p.w_bm25 * f(bm) + p.w_dense * f(cos)


def _neighbour_max(s: np.ndarray, sess: np.ndarray) -> np.ndarray:
    prev = np.full_like(s, -np.inf)
    nxt = np.full_like(s, -np.inf)
    prev[1:] = np.where(sess[1:] == sess[:-1], s[:-1], -np.inf)
    nxt[:-1] = np.where(sess[:-1] == sess[1:], s[1:], -np.inf)
    m = np.maximum(prev, nxt)
    return np.where(np.isfinite(m), m, 0.0)


def combine(comp: dict, index: TurnIndex, p: Params) -> np.ndarray:
    bm, cos = comp["bm"], comp["cos"]
    s = _fuse(bm, cos, p)
    if p.prf_docs or p.dense_prf:
        m = max(p.prf_docs, 5)
        top = np.argpartition(-s, m)[:m]
        top = top[np.argsort(-s[top], kind="stable")]
        if p.prf_docs:
            # RM3-ish: term distribution of the top turns weighted by their (softmaxed) score
            w = np.exp(s[top[: p.prf_docs]] - s[top[0]])
            tw: dict[str, float] = {}
            for d, wd in zip(top[: p.prf_docs], w, strict=False):
                toks = index.doc_tokens[d]
                for t in set(toks):
                    tw[t] = tw.get(t, 0.0) + wd * toks.count(t) / len(toks)
            qset = set(comp["q_toks"])
            exp = sorted((t for t in tw if t not in qset), key=lambda t: -tw[t])[: p.prf_terms]
            if exp:
                tot = sum(tw[t] for t in exp)
                bm = bm + p.prf_weight * _bm25_scores(
                    index, exp, {t: tw[t] / tot * len(exp) for t in exp}
                ) / max(len(comp["q_toks"]), 1)
        if p.dense_prf:
            qv = comp["qvec"] + p.dense_prf * index.vecs[top[:5]].mean(0)
            cos = index.vecs @ (qv / np.linalg.norm(qv))
        s = _fuse(bm, cos, p)
    if p.beta_nb:
        s = s + p.beta_nb * _neighbour_max(s, index.session)
    if p.alpha_sess:
        # session prior: each session scored by its best turn (turns of a session are contiguous)
        starts = np.flatnonzero(np.r_[True, index.session[1:] != index.session[:-1]])
        best = np.maximum.reduceat(s, starts)
        lens = np.diff(np.r_[starts, len(s)])
        s = s + p.alpha_sess * np.repeat(_z(best), lens)
    return s + p.w_speaker * comp["spk"]


def rank_turns(query: str, index: TurnIndex, k: int | None = None, qvec=None) -> list[int]:
    """Turn indices, best first."""
    s = combine(score_components(query, index, qvec), index, index.params)
    if k and k < len(s):
        top = np.argpartition(-s, k)[:k]  # O(n) instead of a full sort
        return top[np.argsort(-s[top], kind="stable")].tolist()
    return np.argsort(-s, kind="stable").tolist()


FINAL = Params()

# --------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------


def recall_row(order: list[int], conv: dict, q: dict) -> list[float]:
    ids = [conv["turns"][j]["dia_id"] for j in order[: max(KS)]]
    return [sum(e in ids[:k] for e in q["ev"]) / len(q["ev"]) for k in KS]


class Evaluator:
    """Caches indexes and per-query score components so that score-level variants are cheap."""

    def __init__(self, convs):
        self.convs = convs
        self._idx = {}
        self._comp = {}

    @staticmethod
    def _index_key(p: Params):
        return (
            p.speaker_in_text,
            p.strip_names,
            p.caption,
            p.img_query,
            p.date_bm25,
            p.prev_ctx,
            p.next_ctx,
            p.method,
            p.k1,
            p.b,
            p.stopwords,
            p.stem,
        )

    def components(self, p: Params, ci: int):
        key = (self._index_key(p), ci)
        if key not in self._comp:
            conv = self.convs[ci]
            idx = build_index(conv["turns"], conv["speakers"], p)
            qtxt = [
                _strip_names(q["q"], idx.names) if p.strip_names else q["q"] for q in conv["qs"]
            ]
            qv = embed(qtxt)
            self._idx[key] = idx
            self._comp[key] = [
                score_components(q["q"], idx, v) for q, v in zip(conv["qs"], qv, strict=False)
            ]
        return self._idx[key], self._comp[key]

    def rows(self, p: Params, conv_ids=None):
        R, C = [], []
        for ci in conv_ids if conv_ids is not None else range(len(self.convs)):
            idx, comps = self.components(p, ci)
            idx.params = p
            for q, comp in zip(self.convs[ci]["qs"], comps, strict=False):
                order = np.argsort(-combine(comp, idx, p), kind="stable")
                R.append(recall_row(order.tolist(), self.convs[ci], q))
                C.append(q["cat"])
        return np.array(R), np.array(C)


def fmt_row(name, R, C):
    s = f"{name:44s}" + " ".join(f"{x:6.3f}" for x in R.mean(0))
    s += "  |" + " ".join(f"{R[c == C, 2].mean():6.3f}" for c in CATS)
    s += "  |" + " ".join(f"{R[c == C, 1].mean():6.3f}" for c in CATS)
    return s


def header():
    return (
        f"{'variant':44s}"
        + " ".join(f"{'R@' + str(k):>6s}" for k in KS)
        + "  |"
        + " ".join(f"{'c' + str(c) + '@10':>6s}" for c in CATS)
        + "  |"
        + " ".join(f"{'c' + str(c) + '@5':>6s}" for c in CATS)
    )


BASE = Params(
    speaker_in_text=True,
    strip_names=False,
    caption=False,
    img_query=False,
    date_bm25=False,
    prev_ctx=False,
    k1=1.5,
    b=0.75,
    w_dense=0.0,
    w_speaker=0.0,
    beta_nb=0.0,
    alpha_sess=0.0,
)


def ablation(ev: Evaluator):
    fin = FINAL
    variants = [
        # --- from the bare baseline upwards ---
        ("baseline BM25 (speaker:text, k1 1.5 b .75)", BASE),
        ("baseline WordLlama cosine", replace(BASE, w_bm25=0.0, w_dense=1.0)),
        ("baseline RRF(BM25, WL)", replace(BASE, fusion="rrf", w_dense=1.0)),
        ("BM25 raw text (no speaker)", replace(BASE, speaker_in_text=False)),
        ("BM25 +caption", replace(BASE, caption=True)),
        ("BM25 +caption +img query", replace(BASE, caption=True, img_query=True)),
        ("BM25 +caption +query +date", replace(BASE, caption=True, img_query=True, date_bm25=True)),
        (
            "  ... BM25 no stemming",
            replace(BASE, caption=True, img_query=True, date_bm25=True, stem=False),
        ),
        (
            "  ... BM25 no stopwords",
            replace(BASE, caption=True, img_query=True, date_bm25=True, stopwords=None),
        ),
        (
            "  ... BM25 k1 1.2 b 0.3",
            replace(BASE, caption=True, img_query=True, date_bm25=True, k1=1.2, b=0.3),
        ),
    ]
    enr = replace(BASE, caption=True, img_query=True, date_bm25=True, k1=1.2, b=0.3)
    for m in ("robertson", "atire", "bm25l", "bm25+"):
        variants.append((f"  ... BM25 variant {m}", replace(enr, method=m)))
    variants += [
        ("enriched BM25, names stripped", replace(enr, speaker_in_text=False, strip_names=True)),
        (
            "  + speaker prior (w 2)",
            replace(enr, speaker_in_text=False, strip_names=True, w_speaker=2.0),
        ),
        ("enriched WL cos, names kept", replace(enr, w_bm25=0, w_dense=1.0)),
        (
            "enriched WL cos, names stripped",
            replace(enr, speaker_in_text=False, strip_names=True, w_bm25=0, w_dense=1.0),
        ),
        (
            "z(BM25)+z(WL), names stripped, spk",
            replace(enr, speaker_in_text=False, strip_names=True, w_dense=1.0, w_speaker=2.0),
        ),
        (
            "  same with RRF fusion (+spk 0.01)",
            replace(
                enr,
                speaker_in_text=False,
                strip_names=True,
                w_dense=1.0,
                w_speaker=0.01,
                fusion="rrf",
            ),
        ),
        (
            "  same with min-max fusion (+spk 0.3)",
            replace(
                enr,
                speaker_in_text=False,
                strip_names=True,
                w_dense=1.0,
                w_speaker=0.3,
                fusion="minmax",
            ),
        ),
        (
            "  + score propagation beta .35 (no ctx)",
            replace(
                enr,
                speaker_in_text=False,
                strip_names=True,
                w_dense=1.0,
                w_speaker=2.0,
                beta_nb=0.35,
            ),
        ),
        (
            "  + prev-turn doc expansion (no prop)",
            replace(fin, beta_nb=0.0, alpha_sess=0.0, w_speaker=2.0),
        ),
        ("  + propagation .35 + session prior .5", replace(fin, w_speaker=2.0)),
        ("FINAL: ... with speaker prior 5", fin),
        # --- leave-one-out from FINAL ---
        ("FINAL - prev ctx", replace(fin, prev_ctx=False)),
        ("FINAL - speaker prior", replace(fin, w_speaker=0.0)),
        ("FINAL - name stripping", replace(fin, strip_names=False)),
        ("FINAL - caption", replace(fin, caption=False)),
        ("FINAL - img query", replace(fin, img_query=False)),
        ("FINAL - date in BM25", replace(fin, date_bm25=False)),
        ("FINAL - dense (BM25 only)", replace(fin, w_dense=0.0)),
        ("FINAL - BM25 (dense only)", replace(fin, w_bm25=0.0)),
        ("FINAL with k1 1.5 b 0.75", replace(fin, k1=1.5, b=0.75)),
        ("FINAL with RRF fusion", replace(fin, fusion="rrf", w_speaker=0.01)),
        # --- additions on top of FINAL ---
        ("FINAL - propagation", replace(fin, beta_nb=0.0)),
        ("FINAL - session prior", replace(fin, alpha_sess=0.0)),
        ("FINAL with speaker prior 2", replace(fin, w_speaker=2.0)),
        ("FINAL with speaker prior 10 (=hard filter)", replace(fin, w_speaker=10.0)),
        ("FINAL + RM3 PRF (5 docs, 10 terms, .5)", replace(fin, prf_docs=5)),
        ("FINAL + dense Rocchio .5", replace(fin, dense_prf=0.5)),
        ("FINAL + next-turn ctx too", replace(fin, next_ctx=True)),
    ]
    return variants


GRID = dict(
    b=(0.3, 0.75),
    w_dense=(0.5, 1.0, 1.5),
    w_speaker=(1.0, 2.0, 3.0, 5.0, 10.0),
    beta_nb=(0.0, 0.2, 0.35, 0.5),
    alpha_sess=(0.0, 0.3, 0.5, 0.8),
)


def objective(R):
    return R[:, 1].mean() + R[:, 2].mean()  # R@5 + R@10


def cross_validate(ev: Evaluator):
    """Tune the 5 GRID parameters on some conversations, test on the others."""
    combos = [dict(zip(GRID, v, strict=False)) for v in itertools.product(*GRID.values())]
    n = len(ev.convs)
    # per-conversation recall rows for every combo (computed once)
    rows = {}
    for i, cmb in enumerate(combos):
        p = replace(FINAL, **cmb)
        for ci in range(n):
            rows[i, ci] = ev.rows(p, [ci])

    def agg(i, cis):
        R = np.concatenate([rows[i, ci][0] for ci in cis])
        C = np.concatenate([rows[i, ci][1] for ci in cis])
        return R, C

    fin_i = next(i for i, c in enumerate(combos) if replace(FINAL, **c) == FINAL)
    half = (n + 1) // 2
    splits = [
        ("2-fold A->B", list(range(half)), list(range(half, n))),
        ("2-fold B->A", list(range(half, n)), list(range(half))),
    ]
    splits += [
        (f"LOCO test {ev.convs[t]['name']}", [c for c in range(n) if c != t], [t]) for t in range(n)
    ]
    print(f"grid: {GRID}  ({len(combos)} combos), objective R@5+R@10")
    print(
        f"{'split':26s} {'chosen params':58s} {'test R@5':>8s} {'R@10':>6s} | FINAL on test R@5 R@10 | best-on-test R@10"
    )
    pooled_R, pooled_C = [], []
    for name, tr, te in splits:
        best = max(range(len(combos)), key=lambda i: objective(agg(i, tr)[0]))
        Rt, Ct = agg(best, te)
        Rf, _ = agg(fin_i, te)
        oracle = max(agg(i, te)[0][:, 2].mean() for i in range(len(combos)))
        cp = ",".join(f"{k}={v}" for k, v in combos[best].items())
        print(
            f"{name:26s} {cp:58s} {Rt[:, 1].mean():8.3f} {Rt[:, 2].mean():6.3f} | {Rf[:, 1].mean():8.3f} {Rf[:, 2].mean():6.3f}"
            f"      | {oracle:6.3f}"
        )
        if name.startswith("LOCO"):
            pooled_R.append(Rt)
            pooled_C.append(Ct)
    R, C = np.concatenate(pooled_R), np.concatenate(pooled_C)
    print(fmt_row("LOCO pooled (tuned on the other 4)", R, C))
    best_all = max(range(len(combos)), key=lambda i: objective(agg(i, range(n))[0]))
    print(
        "best combo on all dev convs:",
        combos[best_all],
        "R@5 {:.3f} R@10 {:.3f}".format(*tuple(agg(best_all, range(n))[0][:, 1:3].mean(0))),
    )


def timing(convs, n_target=100_000, n_queries=200):
    """Query cost on a synthetic 100k-turn index (dev turns replicated, sessions renumbered)."""
    base = [
        {**t, "session": 100 * ci + t["session"]} for ci, c in enumerate(convs) for t in c["turns"]
    ]
    reps = n_target // len(base) + 1
    turns = [{**t, "session": 10_000 * r + t["session"]} for r in range(reps) for t in base]
    turns = turns[:n_target]
    speakers = sorted({t["speaker"] for t in turns})
    t0 = time.time()
    idx = build_index(turns, speakers, FINAL)
    t_build = time.time() - t0
    qs = [q["q"] for c in convs for q in c["qs"]][:n_queries]
    rank_turns(qs[0], idx, k=10)
    t0 = time.time()
    for q in qs:
        rank_turns(q, idx, k=10)
    dt = (time.time() - t0) / len(qs)
    # breakdown
    t0 = time.time()
    comps = [score_components(q, idx) for q in qs]
    t_comp = (time.time() - t0) / len(qs)
    t0 = time.time()
    [combine(c, idx, FINAL) for c in comps]
    t_comb = (time.time() - t0) / len(qs)
    print(f"synthetic index: {len(turns)} turns, build {t_build:.1f}s (incl. embedding)")
    print(
        f"rank_turns: {dt * 1000:.1f} ms/query  (BM25+embed+cosine {t_comp * 1000:.1f} ms, fusion/prop/session/speaker {t_comb * 1000:.1f} ms, rest = top-k)"
    )
    for name, p in [
        ("+ RM3 PRF", replace(FINAL, prf_docs=5)),
        ("+ dense Rocchio", replace(FINAL, dense_prf=0.5)),
    ]:
        t0 = time.time()
        [combine(c, idx, p) for c in comps[:50]]
        print(f"  {name}: +{(time.time() - t0) / 50 * 1000 - t_comb * 1000:.1f} ms/query")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/datasets/locomo-dev")
    ap.add_argument("--no-cv", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    convs = load_conversations(args.data)
    ev = Evaluator(convs)
    nq = sum(len(c["qs"]) for c in convs)
    print(
        f"{len(convs)} conversations, {sum(len(c['turns']) for c in convs)} turns, {nq} questions (cat 1-4)"
    )
    print(header())
    for name, p in ablation(ev):
        R, C = ev.rows(p)
        print(fmt_row(name, R, C), flush=True)
    print(f"[{time.time() - t0:.0f}s]\n")
    if not args.no_cv:
        print("== cross-validation ==")
        cross_validate(ev)
        print(f"[{time.time() - t0:.0f}s]\n")
    if not args.no_timing:
        print("== query-time cost ==")
        timing(convs)
        print(f"[{time.time() - t0:.0f}s]")


if __name__ == "__main__":
    main()
