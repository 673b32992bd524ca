import sys, time
sys.path.insert(0, '/work/main/benchmarks/research')
from core import *
import numpy as np, bm25s

KS = (1, 5, 10, 25)
convs = load()
print(sum(len(c['turns']) for c in convs), 'turns', sum(len(c['qs']) for c in convs), 'qs')

def tok(texts, stop='en', stem=True):
    return bm25s.tokenize(texts, stopwords=stop, stemmer=STEM if stem else None, return_ids=False, show_progress=False)

def bm25_matrix(docs, queries, method='lucene', k1=1.5, b=0.75, stop='en', stem=True, delta=0.5):
    dt = tok(docs, stop, stem)
    r = bm25s.BM25(method=method, k1=k1, b=b, delta=delta)
    r.index(dt, show_progress=False)
    vocab = r.vocab_dict
    qt = tok(queries, stop, stem)
    S = np.zeros((len(queries), len(docs)), np.float32)
    for i, q in enumerate(qt):
        q = [w for w in q if w in vocab]
        if q:
            S[i] = r.get_scores(q)
    return S

def recall(S, conv, ks=KS):
    ids = [t['dia_id'] for t in conv['turns']]
    order = np.argsort(-S, axis=1, kind='stable')
    out = []
    for i, q in enumerate(conv['qs']):
        top = [ids[j] for j in order[i, :max(ks)]]
        out.append([sum(e in top[:k] for e in q['ev']) / len(q['ev']) for k in ks])
    return np.array(out)

def report(name, mats, convs=convs):
    R = np.concatenate([recall(S, c) for S, c in zip(mats, convs)])
    cats = np.concatenate([[q['cat'] for q in c['qs']] for c in convs])
    s = f"{name:40s} " + " ".join(f"{x:.3f}" for x in R.mean(0))
    s += " | " + " ".join(f"c{c}:{R[cats==c,2].mean():.3f}" for c in (1,2,3,4))
    print(s, flush=True)
    return R
