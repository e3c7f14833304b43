"""Document functions of the gmod_shapes lmms-eval task (gmod_shapes.yaml): one user message with the image
first, then the question (as LLaVA's answering scripts and `gmod generate --image` order them)."""
from PIL import Image


def doc_to_visual(doc):
    return [Image.open(doc["image"]).convert("RGB")]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    return doc["question"]


def doc_to_messages(doc, lmms_eval_specific_kwargs=None):
    return [{"role": "user", "content": [{"type": "image", "url": doc_to_visual(doc)[0]},
                                         {"type": "text", "text": doc_to_text(doc)}]}]


def process_results(doc, results):
    return {"exact_match": float(results[0].strip().lower() == doc["answer"].strip().lower())}
