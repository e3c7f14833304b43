#!/usr/bin/env python3
"""Turns the demo data's held-out records (gmod data demo) into a benchmark question set for `gmod answer` and
`gmod score` (docs/eval.md): DIR/questions.jsonl in LLaVA's model_vqa_loader form (question_id, image, text with
the short-answer instruction) and DIR/gqa_questions.json as GQA's annotation ({question_id: {"answer", "types"}}).
Python standard library only. Usage: make_demo_questions.py DEMO_DIR"""
import json
import sys

d = sys.argv[1]
with open(d + "/heldout.json") as f:
    records = json.load(f)
questions, truth = [], {}
for i, r in enumerate(records):
    q = r["conversations"][0]["value"].replace("<image>", "").strip()
    qid = "demo%04d" % i
    questions.append({"question_id": qid, "image": r["image"],
                      "text": q + "\nAnswer the question using a single word or phrase.", "category": "demo"})
    truth[qid] = {"answer": r["conversations"][1]["value"].lower(), "types": {"structural": "query"}}
with open(d + "/questions.jsonl", "w") as f:
    f.write("".join(json.dumps(q) + "\n" for q in questions))
with open(d + "/gqa_questions.json", "w") as f:
    json.dump(truth, f)
print("wrote %d questions to %s/questions.jsonl" % (len(questions), d))
