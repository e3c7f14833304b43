// CheckpointFiles (model/checkpoint_files.h): a Hugging Face directory's tensors from safetensors or PyTorch .bin
// files, the directory order transformers uses, and the named errors for .bin files that are not a dict of tensors.
// The .bin files are the γ-MoD fixture's saved/ directories (written by the original's own save path with
// transformers 4.31, tests/fixtures/make_gamma_mod_fixtures.py) and tests/fixtures/checkpoint_files/ (torch.save of
// what is not a state dict, make_checkpoint_files_fixtures.py).
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "model/checkpoint_files.h"
#include "model/safetensors.h"
#include "tests/common/error_of.h"
#include "tests/common/paths.h"

using gmod::test::error_of;

using namespace gmod;
namespace fs = std::filesystem;

namespace {

const std::string kSaved = "gamma_mod/llava_clip_mod12/saved/";

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void copy(const std::string& from, const std::string& to) {
  fs::create_directories(fs::path(to).parent_path());
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

}  // namespace

TEST(CheckpointFiles, ReadsShardedBinAsTransformersWritesIt) {
  const auto dir = test::fixture(kSaved + "sharded_bin");
  CheckpointFiles ck(dir);
  EXPECT_TRUE(ck.pickled());
  EXPECT_EQ(ck.files().size(), 3u);
  nlohmann::json index;
  std::ifstream(dir + "/pytorch_model.bin.index.json") >> index;
  std::vector<std::string> want;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    want.push_back(it.key());
    EXPECT_NE(ck.file_of(it.key()).find(it->get<std::string>()), std::string::npos) << it.key();
  }
  std::sort(want.begin(), want.end());
  EXPECT_EQ(ck.names(), want);
  // The same tensors, bit for bit, as the fixture's safetensors copy of the model.
  CheckpointFiles st(test::fixture("gamma_mod/llava_clip_mod12"));
  EXPECT_FALSE(st.pickled());
  int compared = 0;
  for (const auto& n : ck.names()) {
    if (!st.has(n)) continue;
    EXPECT_TRUE(at::equal(ck.tensor(n), st.tensor(n))) << n;
    EXPECT_EQ(ck.scalar_type(n), st.scalar_type(n)) << n;
    EXPECT_EQ(ck.shape(n), st.shape(n)) << n;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(st.names().size()));
}

TEST(CheckpointFiles, DirectoryOrderIsTransformersAndOtherBinFilesAreNeverOpened) {
  test::TempDir tmp;
  const auto bin = test::fixture(kSaved + "trainer_bin/pytorch_model.bin");
  const auto args = test::fixture(kSaved + "trainer_bin/training_args.bin");  // a pickled TrainingArguments
  // pytorch_model.bin beside the Trainer's training_args.bin: only the weights are opened.
  copy(bin, tmp.str("a/pytorch_model.bin"));
  copy(args, tmp.str("a/training_args.bin"));
  CheckpointFiles a(tmp.str("a"));
  EXPECT_EQ(a.files(), std::vector<std::string>{tmp.str("a/pytorch_model.bin")});
  EXPECT_TRUE(a.has("model.layers.2.router.weight"));
  // model.safetensors wins over pytorch_model.bin, as in from_pretrained.
  save_safetensors(tmp.str("a/model.safetensors"), {{"only", at::ones({2})}});
  CheckpointFiles b(tmp.str("a"));
  EXPECT_EQ(b.names(), std::vector<std::string>{"only"});
  EXPECT_FALSE(b.pickled());
  // Loose .bin files are not a checkpoint.
  copy(bin, tmp.str("c/other.bin"));
  const auto e = error_of([&] { CheckpointFiles c(tmp.str("c")); });
  EXPECT_NE(e.find("pytorch_model.bin.index.json, pytorch_model.bin"), std::string::npos) << e;
  // A .bin file by its own path.
  CheckpointFiles d(tmp.str("c/other.bin"));
  EXPECT_TRUE(d.pickled());
}

TEST(CheckpointFiles, BinThatIsNotADictOfTensorsIsANamedError) {
  test::TempDir tmp;
  // A pickled Python object of a class LibTorch's unpickler does not build (the Trainer's training_args.bin).
  copy(test::fixture(kSaved + "trainer_bin/training_args.bin"), tmp.str("obj/pytorch_model.bin"));
  auto e = error_of([&] { CheckpointFiles c(tmp.str("obj")); });
  EXPECT_NE(e.find(tmp.str("obj/pytorch_model.bin")), std::string::npos) << e;
  EXPECT_NE(e.find("references the Python global transformers.training_args.TrainingArguments"), std::string::npos)
      << e;

  // Written by torch.save (tests/fixtures/make_checkpoint_files_fixtures.py), each as a directory's pytorch_model.bin.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"int.bin", "pytorch_model.bin: entry 'step' is a Int, expected a dict of tensors"},
      {"complex.bin", "pytorch_model.bin: tensor 'w' is a ComplexFloat tensor"},
      {"nested.bin", "pytorch_model.bin: entry 'meta.note' is a String"},
      {"list.bin", "pytorch_model.bin: top-level object is a GenericList"},
  };
  for (const auto& [file, want] : cases) {
    const auto dir = tmp.str(file + "_dir");
    copy(test::fixture("checkpoint_files/" + file), dir + "/pytorch_model.bin");
    e = error_of([&] { CheckpointFiles c(dir); });
    EXPECT_NE(e.find(dir + "/" + want), std::string::npos) << file << ": " << e;
  }
  // What LibTorch's own pickle_save writes is not what torch.save writes (it tags dicts with a TorchScript global).
  auto tagged = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  tagged.insert("w", at::IValue(at::ones({2})));
  write_bytes(tmp.str("tagged/pytorch_model.bin"), torch::pickle_save(at::IValue(tagged)));
  e = error_of([&] { CheckpointFiles c(tmp.str("tagged")); });
  EXPECT_NE(e.find("references the Python global torch.jit._pickle.restore_type_tag"), std::string::npos) << e;

  // An index naming a shard that is not there.
  for (const auto& f : {"pytorch_model.bin.index.json", "pytorch_model-00001-of-00003.bin",
                        "pytorch_model-00003-of-00003.bin"})
    copy(test::fixture(kSaved + "sharded_bin/") + f, tmp.str(std::string("gone/") + f));
  e = error_of([&] { CheckpointFiles c(tmp.str("gone")); });
  EXPECT_NE(e.find("pytorch_model-00002-of-00003.bin, which does not exist"), std::string::npos) << e;
}
