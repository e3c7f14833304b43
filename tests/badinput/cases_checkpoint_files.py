"""Bad checkpoint files in a Hugging Face directory as the original γ-MoD code saves it
(tests/fixtures/gamma_mod/llava_clip_mod12/saved/*, make_gamma_mod_fixtures.py): PyTorch .bin files holding
something other than a dict of tensors (a pickled object of a Python class gmod does not know, a dict with an int),
an index naming a shard that is gone, and shared-router copies that differ. Each goes through the commands that
load a model directory. Interface: tests/badinput/run_corpus.py."""
import io
import json
import os
import pickle
import shutil
import struct
import zipfile

SAVED = "tests/fixtures/gamma_mod/llava_clip_mod12/saved"


def copy_saved(ctx, variant, name):
    dst = os.path.join(ctx.tmp, name)
    shutil.copytree(os.path.join(ctx.root, SAVED, variant), dst)
    return dst


def replace_pickle(path, obj):
    """The torch.save zip at `path` with its data.pkl replaced by pickle protocol 2 of `obj` (records kept)."""
    with zipfile.ZipFile(path) as z:
        records = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in records:
            z.writestr(name, pickle.dumps(obj, protocol=2) if name.endswith("/data.pkl") else data)
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def cases(ctx):
    c = []

    def through(name, model_dir, expect):
        out = os.path.join(ctx.tmp, "out", name)
        argv = {
            "forward": ["forward", "--model", model_dir, "--steps", "1", "--seq", "8"],
            "export": ["export", "--from-hf", model_dir, "--out", out + "_export"],
        }
        for cmd, a in argv.items():
            c.append(dict(name=f"{name}_{cmd}", argv=a, rc=1, expect=expect))

    # The Trainer's training_args.bin (a pickled transformers TrainingArguments) in the place of the weights: the
    # pickle's globals are checked before anything is unpickled; the file and the class are named.
    d = copy_saved(ctx, "trainer_bin", "bin_python_object")
    shutil.copy(os.path.join(d, "training_args.bin"), os.path.join(d, "pytorch_model.bin"))
    through("checkpoint_bin_python_object", d,
            r"pytorch_model\.bin: not a state dict of tensors as torch\.save writes it: it references the Python "
            r"global transformers\.training_args\.TrainingArguments")

    # A dict whose value is an int, not a tensor.
    d = copy_saved(ctx, "trainer_bin", "bin_dict_int")
    replace_pickle(os.path.join(d, "pytorch_model.bin"), {"model.embed_tokens.weight": 7})
    through("checkpoint_bin_dict_with_int", d,
            r"pytorch_model\.bin: entry 'model\.embed_tokens\.weight' is a Int, expected a dict of tensors")

    # A list at the top level.
    d = copy_saved(ctx, "trainer_bin", "bin_list")
    replace_pickle(os.path.join(d, "pytorch_model.bin"), [1, 2])
    through("checkpoint_bin_top_level_list", d, r"pytorch_model\.bin: top-level object is a GenericList")

    # A shard of a sharded .bin save removed.
    d = copy_saved(ctx, "sharded_bin", "bin_shard_gone")
    os.remove(os.path.join(d, "pytorch_model-00002-of-00003.bin"))
    through("checkpoint_bin_shard_missing", d,
            r"pytorch_model\.bin\.index\.json: weight_map maps tensor '.*' to shard .*pytorch_model-00002-of-00003"
            r"\.bin, which does not exist")

    # The shared router's copies differ (one layer's copy changed in place in model.safetensors).
    src = os.path.join(ctx.root, "tests/fixtures/gamma_mod/llava_clip_mod12")
    d = os.path.join(ctx.tmp, "router_copies_differ")
    os.makedirs(d)
    shutil.copytree(os.path.join(src, "clip"), os.path.join(d, "clip"))
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(src, f), os.path.join(d, f))
    with open(os.path.join(d, "model.safetensors"), "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        f.seek(8 + n + header["model.layers.2.router.weight"]["data_offsets"][0])
        f.write(struct.pack("<f", 0.5))
    through("checkpoint_router_copies_differ", d,
            r"router copies differ: 'model\.layers\.2\.router\.weight' is not equal to 'model\.layers\.1\.router\.weight'")
    return c
