#!/usr/bin/env python3
"""Turns the demo data's held-out records (gmod data demo) into a benchmark question set for `gmod answer` and
`gmod score` (docs/eval.md): DIR/questions.jsonl in LLaVA's model_vqa_loader form (question_id, image, text with
the short-answer instruction) and DIR/gqa_questions.json as GQA's annotation ({question_id: {"answer", "types"}});
DIR/sqa_test.json in model_vqa_science's form (id, image, conversations) with two options per question, and
DIR/sqa/problems.json + pid_splits.json as ScienceQA's annotation; DIR/mmbench_dev.tsv as MMBench's table (base64
images, three options, circular copies index + 1e6 with the options rotated); DIR/mme/ as MME's release folder
(category "color" with question files beside the images, "commonsense_reasoning" with images/ and
questions_answers_YN/; two yes/no questions per image); DIR/mmmu.jsonl as MMMU's samples exported from its
Hugging Face rows (id, question, options as a Python list literal, answer, question_type, image_1), multiple
choice and open.
Python standard library only. Usage: make_demo_questions.py DEMO_DIR"""
import base64
import csv
import json
import os
import shutil
import sys

d = sys.argv[1]
with open(d + "/heldout.json") as f:
    records = [r for r in json.load(f) if "image" in r]  # the benchmarks ask about images
questions, truth = [], {}
for i, r in enumerate(records):
    q = r["conversations"][0]["value"].replace("<image>", "").strip()
    qid = "demo%04d" % i
    questions.append({"question_id": qid, "image": r["image"],
                      "text": q + "\nAnswer the question using a single word or phrase.", "category": "demo"})
    truth[qid] = {"answer": r["conversations"][1]["value"].lower(), "types": {"structural": "query"}}
sqa, problems = [], {}
for i, r in enumerate(records):
    q = r["conversations"][0]["value"].replace("<image>", "").strip()
    a = r["conversations"][1]["value"]
    choices = [a, "none of these"] if i % 2 == 0 else ["none of these", a]
    pid = str(100 + i)
    sqa.append({"id": pid, "image": r["image"], "conversations": [
        {"from": "human", "value": "<image>\nQuestion: %s\nOptions: (A) %s (B) %s" % (q, choices[0], choices[1])},
        {"from": "gpt", "value": "AB"[i % 2]}]})
    problems[pid] = {"choices": choices, "answer": i % 2, "question": q}
with open(d + "/sqa_test.json", "w") as f:
    json.dump(sqa, f)
os.makedirs(d + "/sqa", exist_ok=True)
with open(d + "/sqa/problems.json", "w") as f:
    json.dump(problems, f)
with open(d + "/sqa/pid_splits.json", "w") as f:
    json.dump({"test": sorted(problems)}, f)
rows = []
for i, r in enumerate(records):
    q = r["conversations"][0]["value"].replace("<image>", "").strip()
    with open(os.path.join(d, r["image"]), "rb") as f:
        image = base64.b64encode(f.read()).decode()
    options = [r["conversations"][1]["value"], "none of these", "all of these"]
    for k in range(3 if i % 2 == 0 else 1):  # circular copies for every other question
        rot = options[k:] + options[:k]
        rows.append([str(i + k * 1000000), q, "" if i % 3 else "Look at the picture.", rot[0], rot[1], rot[2], "",
                     "ABC"[(3 - k) % 3], "shapes", "perception", "demo", "", image])
with open(d + "/mmbench_dev.tsv", "w", newline="") as f:
    w = csv.writer(f, delimiter="\t", lineterminator="\n")
    w.writerow(["index", "question", "hint", "A", "B", "C", "D", "answer", "category", "l2-category", "source", "comment",
                "image"])
    w.writerows(rows)
# MME's release layout: one folder per category; NAME.txt holds "question<TAB>Yes|No" per question.
colours = ["red", "green", "blue", "yellow", "orange", "purple"]
for i, r in enumerate(records):
    q = r["conversations"][0]["value"]
    present = next((c for c in colours if c in q), colours[i % len(colours)])
    absent = next(c for c in colours if c != present and c not in q)
    cat = "color" if i % 2 == 0 else "commonsense_reasoning"
    base = os.path.join(d, "mme", cat)
    img_dir, qa_dir = (base, base) if cat == "color" else (base + "/images", base + "/questions_answers_YN")
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(qa_dir, exist_ok=True)
    stem = "%04d" % i
    shutil.copyfile(os.path.join(d, r["image"]), os.path.join(img_dir, stem + ".png"))
    with open(os.path.join(qa_dir, stem + ".txt"), "w") as f:
        f.write("Is there a %s object in the image? Please answer yes or no.\tYes\n" % present)
        f.write("Is there a %s object in the image?  Please answer yes or no.\tNo\n" % absent)
# MMMU's samples: shape questions as multiple choice, counting questions as open ones.
with open(d + "/mmmu.jsonl", "w") as f:
    for i, r in enumerate(records):
        q = r["conversations"][0]["value"].replace("<image>", "").strip()
        a = r["conversations"][1]["value"]
        rec = {"id": "validation_Demo_Shapes_%d" % (i + 1), "question": "<image 1> " + q, "image_1": r["image"]}
        if a.isdigit():
            rec.update(question_type="open", options="[]", answer=a)
        else:
            opts = [a, "Hexagon", "Star"] if i % 2 else ["Hexagon", a, "Star's"]
            rec.update(question_type="multiple-choice", options=repr(opts), answer="AB"[opts.index(a)])
        f.write(json.dumps(rec) + "\n")
with open(d + "/questions.jsonl", "w") as f:
    f.write("".join(json.dumps(q) + "\n" for q in questions))
with open(d + "/gqa_questions.json", "w") as f:
    json.dump(truth, f)
print("wrote %d questions to %s/questions.jsonl" % (len(questions), d))
