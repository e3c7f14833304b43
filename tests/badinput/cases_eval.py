"""Bad answer, annotation and question files through `gmod score` and `gmod answer` (docs/eval.md): files that are
not JSON or not the benchmark's shape, invalid UTF-8, a POPE label file with the wrong name, a ScienceQA split
that does not exist, an empty MMBench table, VQA annotations without 10 answers, a question image that does not
decode (a file, or MMBench's base64), a chunk beyond the chunk count, an MME question file line without its
tab and one without its image, MMMU options that are not a Python list, and `gmod report` suites with an
unknown key or scorer; a malformed answer line listed before the missing answers. Interface: tests/badinput/run_corpus.py."""
import json
import os


def cases(ctx):
    w = ctx.write
    ans = w("answers.jsonl", json.dumps({"question_id": "1", "prompt": "What?\nAnswer.", "text": "yes"}) + "\n")
    notjson = w("notjson.json", "{ this is not json")
    model = ["--model", os.path.join(ctx.root, "configs/demo_model"), "--random-init", "0", "--tokenizer",
             os.path.join(ctx.root, "tests/fixtures/tokenizer/sp/tokenizer.model")]
    w("sqa/problems.json", json.dumps({"1": {"choices": ["a", "b"], "answer": 0}}))
    w("sqa/pid_splits.json", json.dumps({"test": ["1"]}))
    w("pope/coco_popular.json", json.dumps({"question_id": "1", "label": "yes"}) + "\n")
    w("broken.png", b"\x89PNG\r\n\x1a\nnot really a png")
    w("mme_bad/color/0001.txt", "Is it red? Please answer yes or no.\tYes\nno tab on this line\n")
    w("mme_bad/color/0001.png", b"\x89PNG\r\n\x1a\nnot really a png")
    w("mme_bad/color/0002.txt", "Is it blue? Please answer yes or no.\tNo\n")
    mmmu_q = w("mmmu_q.jsonl", json.dumps({"id": "validation_Art_1", "question": "Which?", "options": "['a', 'b'",
                                           "answer": "A", "question_type": "multiple-choice"}) + "\n")
    suite = {"models": [{"name": "m", "model": "x"}], "benchmarks": [{"name": "b", "scorer": "gqa", "questions": "q"}]}
    return [
        {"name": "score_sqa_annotations_missing", "argv": ["score", "scienceqa", "--answers", ans, "--annotations",
                                                          os.path.join(ctx.tmp, "no-such-dir")],
         "expect": r"--annotations .*no-such-dir: No such file or directory"},
        {"name": "score_annotations_not_json", "argv": ["score", "textvqa", "--answers", ans, "--annotations", notjson],
         "expect": r"notjson\.json: not a JSON document", "rc": 1},
        {"name": "score_textvqa_no_data", "argv": ["score", "textvqa", "--answers", ans, "--annotations",
                                                   w("tv.json", json.dumps({"dataset": []}))],
         "expect": r"tv\.json: no 'data' list", "rc": 1},
        {"name": "score_gqa_questions_list", "argv": ["score", "gqa", "--answers", ans, "--annotations",
                                                      w("gqa.json", "[1, 2]")],
         "expect": r"gqa\.json: not a JSON object of questions", "rc": 1},
        {"name": "score_sqa_no_split", "argv": ["score", "scienceqa", "--answers", ans, "--annotations",
                                                os.path.join(ctx.tmp, "sqa"), "--split", "minival"],
         "expect": r"pid_splits\.json: no list of problem ids for split 'minival'", "rc": 1},
        {"name": "score_pope_label_name", "argv": ["score", "pope", "--answers", ans, "--questions", ans,
                                                   "--annotations", os.path.join(ctx.tmp, "pope")],
         "expect": r"coco_popular\.json: a POPE label file is named coco_pope_<category>\.json", "rc": 1},
        {"name": "score_mmbench_empty_table", "argv": ["score", "mmbench", "--answers", ans, "--annotations",
                                                       w("mmb.tsv", "")],
         "expect": r"mmb\.tsv: empty table", "rc": 1},
        {"name": "score_vqav2_nine_answers", "argv": ["score", "vqav2", "--rule", "m4c", "--answers",
                                                      w("v2.jsonl", json.dumps({"question_id": 1, "text": "a"})),
                                                      "--annotations", w("v2ann.json", json.dumps(
                                                          {"annotations": [{"question_id": 1, "answers": ["a"] * 9}]}))],
         "expect": r"v2ann\.json\[annotations #0\]: 9 human answers, the VQA score needs 10", "rc": 1},
        {"name": "score_vqav2_vqaeval_no_types", "argv": ["score", "vqav2", "--answers", os.path.join(ctx.tmp, "v2.jsonl"),
                                                          "--annotations", os.path.join(ctx.tmp, "v2ann.json")],
         "expect": r"v2ann\.json\[annotations #0\]: no string 'question_type' and 'answer_type': the original stops",
         "rc": 1},
        {"name": "score_mmmu_eval_only_no_dict", "argv": ["score", "mmmu", "--answers",
                                                          w("mmmu_preds.json", json.dumps({"validation_Art_1": "A"}))],
         "expect": r"mmmu: an \{id: prediction\} answer file \(eval-only mode\) is scored against one --annotations",
         "rc": 2},
        {"name": "score_answers_invalid_utf8", "argv": ["score", "gqa", "--answers",
                                                        w("bad_utf8.jsonl", b'{"question_id": "1", "text": "\xff\xfe"}\n'),
                                                        "--annotations", w("g.json", json.dumps({"1": {"answer": "a"}}))],
         "expect": r"bad_utf8\.jsonl:1: not JSON", "rc": 1},
        # A malformed answer line among 23 unanswered questions: problems are listed in file and line order (the
        # answers file, read first, then the annotations), so the malformed line is the first of the 20 shown even
        # though the annotations' path sorts before the answers' (sorted by path it was hidden behind "no answer").
        {"name": "score_malformed_line_before_missing", "argv": [
            "score", "gqa", "--answers", w("z_answers.jsonl", json.dumps({"question_id": "q1", "text": "a"}) + "\n"
                                          + "{not json\n" + json.dumps({"question_id": "q2", "text": "a"}) + "\n"),
            "--annotations", w("a_gqa.json", json.dumps({f"q{i}": {"answer": "a"} for i in range(1, 26)}))],
         "expect": r"24 problem\(s\)[^\n]*\n  [^\n]*z_answers\.jsonl:2: not JSON[^\n]*\n  [^\n]*a_gqa\.json\S*: no answer"},
        {"name": "score_mmmu_not_objects", "argv": ["score", "mmmu", "--answers", w("mmmu.json", "[1, \"x\"]")],
         "expect": r"mmmu\.json\[#1\]: not a JSON object", "rc": 1},
        {"name": "answer_questions_missing", "argv": ["answer"] + model + [
            "--questions", os.path.join(ctx.tmp, "no_such.jsonl"), "--answers", os.path.join(ctx.tmp, "a.jsonl")],
         "expect": r"no_such\.jsonl: cannot open", "rc": 1},
        {"name": "answer_image_undecodable", "argv": ["answer"] + model + [
            "--questions", w("q.jsonl", json.dumps({"question_id": 7, "image": "broken.png", "text": "What?"}) + "\n"),
            "--answers", os.path.join(ctx.tmp, "a2.jsonl"), "--max-new-tokens", "2"],
         "expect": r"q\.jsonl:1: .*broken\.png", "rc": 1, "timeout": 120},
        {"name": "answer_mmbench_bad_base64", "argv": ["answer"] + model + [
            "--questions", w("mmb_q.tsv", "index\tquestion\tA\tB\timage\n3\tWhat?\tx\ty\t%%%not base64\n"),
            "--answers", os.path.join(ctx.tmp, "a4.jsonl"), "--max-new-tokens", "2"],
         "expect": r"mmb_q\.tsv:2: .*not base64", "rc": 1, "timeout": 120},
        {"name": "answer_chunk_beyond", "argv": ["answer"] + model + [
            "--questions", ans, "--answers", os.path.join(ctx.tmp, "a3.jsonl"), "--num-chunks", "2", "--chunk-idx", "2"],
         "expect": r"--chunk-idx 2 must be below --num-chunks 2", "rc": 2},
        {"name": "answer_mme_bad_lines", "argv": ["answer"] + model + [
            "--questions", os.path.join(ctx.tmp, "mme_bad"), "--answers", os.path.join(ctx.tmp, "a5.jsonl"),
            "--max-new-tokens", "2"],
         "expect": r"0001\.txt:2: not \"question<TAB>answer\".*0002\.txt: no image named 0002", "rc": 1,
         "timeout": 120},
        {"name": "answer_mmmu_bad_options", "argv": ["answer"] + model + [
            "--questions", mmmu_q, "--format", "mmmu", "--answers", os.path.join(ctx.tmp, "a6.json")],
         "expect": r"mmmu_q\.jsonl:1: 'options' of a multiple-choice question: not a Python list of strings", "rc": 1,
         "timeout": 120},
        {"name": "report_suite_unknown_key", "argv": ["report", "--config", w("suite1.json", json.dumps(dict(suite, bogus=1)))],
         "expect": r"suite1\.json: unknown key \"bogus\"", "rc": 1},
        {"name": "report_unknown_scorer", "argv": ["report", "--config", w("suite2.json", json.dumps(
            dict(suite, benchmarks=[{"name": "b", "scorer": "vizwiz", "questions": "q"}])))],
         "expect": r"suite2\.json: benchmarks\[0\]: unknown scorer 'vizwiz'", "rc": 1},
    ]
