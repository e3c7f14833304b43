// End-to-end `gmod train` runs (the executable, under mpirun where the test needs ranks) on the demo dataset and the
// tiny demo model (configs/demo_model, random init, MoD layers 3 and 4): exact resume, resume at another world size,
// SIGTERM, activation checkpointing with the overlapped reduction. Each test is its own
// ctest entry (see CMakeLists.txt).
#include "trainer/checkpoint/checkpoint.h"

#include "data/demo_dataset.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"
#include "tests/trainer/e2e_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

extern char** environ;

namespace {

using json = nlohmann::json;
using gmod::test::TempDir;

using gmod::e2e::bit_equal;
using gmod::e2e::ckpt;
using gmod::e2e::env;
using gmod::e2e::expect_same_model;
using gmod::e2e::flat_optimizer;
using gmod::e2e::gmod_train;
using gmod::e2e::slurp;
using gmod::e2e::step_metrics;

// The shared e2e config (tests/trainer/e2e_util.h) with the trained vision tower and the default collective deadline
// of these runs; tests override with `extra` or --set.
std::string write_config(const std::string& run_dir, const json& extra = json::object()) {
  json e{{"freeze", {{"vision", false}}}, {"parallel", {{"timeout_s", 600.0}}}};
  e.merge_patch(extra);
  return gmod::e2e::write_config(run_dir, e);
}

// Starts `gmod train --config cfg` in the background, output appended to `log`; its pid, or -1.
pid_t spawn_train(const std::string& cfg, const std::string& log) {
  std::vector<std::string> args{GMOD_BIN, "train", "--threads", "1", "--config", cfg};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, GMOD_BIN, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// step -> sorted sample ids consumed in that step by all ranks together.
std::map<int64_t, std::multiset<int64_t>> samples_by_step(const std::string& run_dir, int world) {
  std::map<int64_t, std::multiset<int64_t>> out;
  for (int r = 0; r < world; ++r) {
    std::ifstream in(run_dir + "/samples/rank-" + std::to_string(r) + ".txt");
    EXPECT_TRUE(in) << run_dir << " rank " << r;
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      int64_t step, micro, id;
      ls >> step >> micro;
      while (ls >> id) out[step].insert(id);
    }
  }
  return out;
}

// N + M steps uninterrupted == N steps, stop, resume, M steps on 2 ranks: bitwise weights, optimizer state and
// per-step losses. `sets` configure both runs. Returns the log of the stopped-and-resumed run.
std::string expect_exact_resume(const std::vector<std::string>& sets) {
  TempDir t;
  const std::string u = t.str("uninterrupted"), s = t.str("stopped");
  std::vector<std::string> stop = sets;
  stop.push_back("schedule.exit_at_step=3");
  EXPECT_EQ(gmod_train(2, write_config(u), sets), 0) << slurp(u + ".config.json.log");
  EXPECT_EQ(gmod_train(2, write_config(s), stop), 0) << slurp(s + ".config.json.log");
  EXPECT_TRUE(std::filesystem::exists(ckpt(s, 3)));
  EXPECT_FALSE(std::filesystem::exists(ckpt(s, 6)));
  EXPECT_EQ(gmod_train(2, write_config(s), sets), 0) << slurp(s + ".config.json.log");
  const std::string log = slurp(s + ".config.json.log");
  EXPECT_NE(log.find("resume: " + ckpt(s, 3)), std::string::npos);

  std::vector<int64_t> order;
  auto mu = step_metrics(u), ms = step_metrics(s, &order);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  if (mu.size() != 6u) {
    ADD_FAILURE() << "uninterrupted run logged " << mu.size() << " steps";
    return log;
  }
  for (int64_t k = 1; k <= 6; ++k)
    for (const char* f : {"loss", "lm_loss", "routing_loss", "grad_norm", "lr", "tokens", "skip_ratio"})
      EXPECT_EQ(mu[k][f].dump(), ms[k][f].dump()) << "step " << k << " " << f;
  EXPECT_TRUE(mu[1].contains("skip_ratio"));  // MoD layers report
  // Both ratios per layer: routable tokens are a subset of all tokens, so their skipped share is at least α.
  EXPECT_TRUE(mu[1].contains("skip_ratio_routable"));
  if (mu[1].contains("skip_ratio_routable")) {
    for (auto& [layer, alpha] : mu[1]["skip_ratio"].items()) {
      EXPECT_GE(mu[1]["skip_ratio_routable"][layer].get<double>(), alpha.get<double>() - 1e-12) << "layer " << layer;
    }
  }
  expect_same_model(ckpt(u, 6), ckpt(s, 6));
  for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
    EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(u, 6), n), flat_optimizer(ckpt(s, 6), n))) << n;
  return log;
}

}  // namespace

TEST(TrainE2E, ExactResumeTwoRanks) { expect_exact_resume({}); }

// p-MoD as the trainer's rule (mod.rule pmod: the layers its schedule routes, its router and defaults): trains and
// resumes bitwise, at ZeRO-1, and at ZeRO-3 with every layer checkpointed (recomputed in the backward).
TEST(TrainE2E, PModExactResumeTwoRanks) {
  const std::string log = expect_exact_resume({"mod.rule=pmod"});
  EXPECT_NE(log.find("pmod"), std::string::npos) << log;
}
TEST(TrainE2E, PModZero3CheckpointedExactResume) {
  expect_exact_resume({"mod.rule=pmod", "optimizer.zero_stage=3", "model.activation_checkpointing=full"});
}

// PyramidDrop as the trainer's rule (stages at layers 2 and 4 keeping 1/2 and 1/4 of the image tokens; no router):
// resumes bitwise at ZeRO-1, and at ZeRO-3 with every layer checkpointed (the stage state replayed in the backward).
TEST(TrainE2E, PDropExactResumeTwoRanks) {
  const std::string log = expect_exact_resume({"mod.rule=pdrop:2,4:0.5,0.25"});
  EXPECT_NE(log.find("pdrop"), std::string::npos) << log;
}
TEST(TrainE2E, PDropZero3CheckpointedExactResume) {
  expect_exact_resume(
      {"mod.rule=pdrop:2,4:0.5,0.25", "optimizer.zero_stage=3", "model.activation_checkpointing=full"});
}

// ZeRO-2 (gradient buckets released after each reduce-scatter and re-created by the next backward), weight decay
// with the default exclusions (biases and norms), no overlap: still exact across stop/resume.
TEST(TrainE2E, ExactResumeZero2WeightDecayGroups) {
  const std::string log =
      expect_exact_resume({"optimizer.zero_stage=2", "optimizer.weight_decay=0.1", "optimizer.overlap_comm=false"});
  EXPECT_NE(log.find("tensors excluded (optimizer.no_decay)"), std::string::npos) << log;
}

// A checkpoint saved by 2 ranks resumed by 1 and by 3: the optimizer state is resharded exactly, the data order
// continues (same samples per step as the uninterrupted 2-rank run, none skipped or repeated), and the losses match
// the 2-rank run up to reduction-order rounding.
TEST(TrainE2E, ResumeAtOtherWorldSizes) {
  TempDir t;
  const std::string ref = t.str("ref2"), a = t.str("a2");
  const json six{{"batch", {{"global_batch", 6}}}, {"schedule", {{"max_steps", 4}}},
                 {"metrics", {{"log_sample_ids", true}}}};
  ASSERT_EQ(gmod_train(2, write_config(ref, six)), 0) << slurp(ref + ".config.json.log");
  ASSERT_EQ(gmod_train(2, write_config(a, six), {"schedule.exit_at_step=2"}), 0) << slurp(a + ".config.json.log");
  const auto want = samples_by_step(ref, 2);
  ASSERT_EQ(want.size(), 4u);
  std::multiset<int64_t> all;
  for (auto& [step, ids] : want) {
    EXPECT_EQ(ids.size(), 6u);
    all.insert(ids.begin(), ids.end());
  }
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 24u) << "no sample twice within the epoch";
  const auto mref = step_metrics(ref);

  for (int world : {1, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    // Reshard only: load at the new size and save again without training.
    const std::string re = t.str("reshard" + std::to_string(world));
    ASSERT_EQ(gmod_train(world, write_config(re, six), {"resume=" + ckpt(a, 2), "schedule.exit_at_step=2"}), 0)
        << slurp(re + ".config.json.log");
    EXPECT_EQ(gmod::CheckpointReader(ckpt(re, 2)).world_size(), world);
    expect_same_model(ckpt(a, 2), ckpt(re, 2));
    for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
      EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(a, 2), n), flat_optimizer(ckpt(re, 2), n))) << n;
    EXPECT_EQ(gmod::CheckpointReader(ckpt(re, 2)).data_position(), gmod::CheckpointReader(ckpt(a, 2)).data_position());

    // Continue training at the new size.
    const std::string b = t.str("b" + std::to_string(world));
    ASSERT_EQ(gmod_train(world, write_config(b, six), {"resume=" + ckpt(a, 2)}), 0) << slurp(b + ".config.json.log");
    const auto got = samples_by_step(b, world);
    ASSERT_EQ(got.size(), 2u);
    for (int64_t step : {3, 4}) {
      ASSERT_TRUE(got.count(step)) << step;
      EXPECT_EQ(got.at(step), want.at(step)) << "step " << step;
    }
    const auto mb = step_metrics(b);
    for (int64_t step : {3, 4}) {
      const double x = mb.at(step)["lm_loss"].get<double>(), y = mref.at(step)["lm_loss"].get<double>();
      EXPECT_NEAR(x, y, 1e-4 * std::abs(y)) << "step " << step;
      EXPECT_EQ(mb.at(step)["lr"].get<double>(), mref.at(step)["lr"].get<double>());
      // Step FLOPs are counted per sample (what each layer kept, its attention pairs) and summed over micro-batches
      // and ranks, so the same samples cost the same at every world size; MoD layers make it less than dense.
      const double f = mb.at(step)["flops"].get<double>(), fref = mref.at(step)["flops"].get<double>();
      EXPECT_NEAR(f, fref, 1e-9 * fref) << "step " << step;
      EXPECT_LT(fref, mref.at(step)["dense_flops"].get<double>()) << "step " << step;
    }
  }
}

// SIGTERM mid-run: the step finishes, a checkpoint is written, exit code 0; resuming continues from it.
TEST(TrainE2E, SigtermSavesAndExitsZero) {
  TempDir t;
  const std::string run = t.str("sig");
  const std::string cfg = write_config(run, {{"schedule", {{"max_steps", 100000}}}, {"deterministic", false}});
  const std::string log = cfg + ".log";
  const pid_t pid = spawn_train(cfg, log);
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (step_metrics(run).size() < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(step_metrics(run).size(), 3u) << slurp(log);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << slurp(log);
  EXPECT_EQ(WEXITSTATUS(status), 0) << slurp(log);
  const int64_t last = step_metrics(run).rbegin()->first;
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, last)), "") << slurp(log);
  EXPECT_NE(slurp(log).find("stopped by signal at step " + std::to_string(last)), std::string::npos) << slurp(log);
  // And the run continues from there.
  ASSERT_EQ(gmod_train(0, cfg, {"schedule.exit_at_step=" + std::to_string(last + 1)}), 0) << slurp(log);
  EXPECT_TRUE(std::filesystem::exists(ckpt(run, last + 1)));
}

// Converted layers leave parameter names unchanged, so resuming with another conversion must be refused, not loaded.
TEST(TrainE2E, ResumeWithOtherMoDLayersIsRefused) {
  TempDir t;
  const std::string run = t.str("modlayers");
  const std::string cfg = write_config(run, {{"checkpoint", {{"every", 1}, {"keep_last", 2}}}});
  ASSERT_EQ(gmod_train(0, cfg, {"schedule.exit_at_step=1", "mod.rule=layers:3,4"}), 0) << slurp(cfg + ".log");
  EXPECT_NE(gmod_train(0, cfg, {"schedule.exit_at_step=2", "mod.rule=layers:2,3"}), 0);
  const std::string log = slurp(cfg + ".log");
  EXPECT_NE(log.find("mod_layers_idx = [3,4] but this run converts to [2,3]"), std::string::npos) << log;
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 1)), "");  // the checkpoint it had is untouched
}

// configs/tiny_parts.json as CI runs it: stage 2 composed from parts (LLM + CLIP + mm_projector.bin), bf16, ZeRO-2,
// frozen tower, ARank by the paper's protocol -> keep_top:2, 2 ranks. The frozen tower and the untrained rows
// must be the fixture's bits; the trained LLM must have moved.
TEST(TrainE2E, TinyPartsConfigTrainsFromComposedParts) {
  TempDir t;
  const std::string src = gmod::test::source_dir(), run = t.str("parts");
  const std::string cmd = std::string(GMOD_MPIEXEC) + " " + GMOD_MPIEXEC_NP + " 2 " + GMOD_MPIRUN_FLAGS + " " +
                          GMOD_BIN + " train --threads 1 --config " + src + "/configs/tiny_parts.json" +
                          " --set model.llm=" + src + "/tests/fixtures/parts/llm --set model.vision=" + src +
                          "/tests/fixtures/parts/vision --set model.projector=" + src +
                          "/tests/fixtures/parts/mm_projector.bin --set data.tokenizer=" + src +
                          "/tests/fixtures/tokenizer/sp/tokenizer.model --set data.train=" + t.str("data/train.json") +
                          " --set run_dir=" + run + " > " + run + ".log 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string log = slurp(run + ".log");
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << log;
  EXPECT_NE(log.find("model: llm="), std::string::npos) << log;
  EXPECT_NE(log.find("first prompts up to the assistant turn"), std::string::npos) << log;
  EXPECT_NE(log.find("bf16"), std::string::npos) << log;
  EXPECT_EQ(step_metrics(run).size(), 4u);
  const json arank = json::parse(slurp(run + "/arank.json"));
  EXPECT_FALSE(arank.empty());
  gmod::CheckpointReader reader(ckpt(run, 4));
  EXPECT_EQ(reader.config()["optimizer"]["zero_stage"], 2);
  const auto mod_layers = reader.config()["mod"]["config"]["mod_layers_idx"];
  EXPECT_EQ(mod_layers.size(), 2u) << mod_layers.dump();  // 4 layers, keep_top:2
  gmod::SafetensorsCheckpoint vision(src + "/tests/fixtures/parts/vision"), llm(src + "/tests/fixtures/parts/llm");
  const at::Tensor tower = reader.read_model_tensor("vision.vision_model.encoder.layers.1.mlp.fc1.weight");
  EXPECT_TRUE(bit_equal(tower, vision.tensor("encoder.layers.1.mlp.fc1.weight").to(at::kBFloat16)));
  const at::Tensor q = reader.read_model_tensor("llm.layers.0.self_attn.q_proj.weight");
  EXPECT_FALSE(bit_equal(q, llm.tensor("model.layers.0.self_attn.q_proj.weight").to(at::kBFloat16)));
}

// A signal to mpirun (as a scheduler or an operator sends it) on a 2-rank job: Open MPI forwards SIGUSR1 to every
// rank. Every rank stops at the same step boundary, the checkpoint of that step is written and the job exits 0;
// resuming from it gives bitwise the weights of an uninterrupted run. (SIGTERM to mpirun is not usable: Open MPI 4.1
// tears its runtime down at once, see docs/launch.md.)
void signal_to_mpirun_saves_and_resumes_exactly(int sig, const std::string& name) {
  TempDir t;
  const json extra = {{"schedule", {{"max_steps", 100000}}}};
  const std::string run = t.str(name), cfg = write_config(run, extra);
  const std::string cmd = std::string("exec ") + GMOD_MPIEXEC + " " + GMOD_MPIEXEC_NP + " 2 " + GMOD_MPIRUN_FLAGS +
                          " " + GMOD_BIN + " train --threads 1 --config " + cfg +
                          " >> " + cfg + ".log 2>&1";
  std::vector<std::string> args{"/bin/sh", "-c", cmd};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, argv.data(), environ), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (step_metrics(run).size() < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(step_metrics(run).size(), 3u) << slurp(cfg + ".log");
  ASSERT_EQ(kill(pid, sig), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const std::string log = slurp(cfg + ".log");
  ASSERT_TRUE(WIFEXITED(status)) << log;
  EXPECT_EQ(WEXITSTATUS(status), 0) << log;
  const int64_t last = step_metrics(run).rbegin()->first;
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, last)), "") << log;
  EXPECT_NE(log.find("stopped by signal at step " + std::to_string(last)), std::string::npos) << log;

  const std::string stop = "schedule.exit_at_step=" + std::to_string(last + 2);
  ASSERT_EQ(gmod_train(2, cfg, {stop}), 0) << slurp(cfg + ".log");
  const std::string ref = t.str(name + "-ref"), ref_cfg = write_config(ref, extra);
  ASSERT_EQ(gmod_train(2, ref_cfg, {stop}), 0) << slurp(ref_cfg + ".log");
  expect_same_model(ckpt(run, last + 2), ckpt(ref, last + 2));
  EXPECT_EQ(step_metrics(run).at(last + 2)["loss"].dump(), step_metrics(ref).at(last + 2)["loss"].dump());
}

TEST(TrainE2E, SigusrToMpirunSavesAndResumesExactly) { signal_to_mpirun_saves_and_resumes_exactly(SIGUSR1, "usr1"); }

// Resuming with another seed, batch or dataset would silently break "no sample skipped or repeated": refused with
// every difference named, unless resume_allow_changes; a checkpoint of another format_version is refused by name.
TEST(TrainE2E, ResumeWithChangedSetupIsRefused) {
  TempDir t;
  const std::string run = t.str("guard");
  const std::string cfg = write_config(run, {{"checkpoint", {{"every", 1}, {"keep_last", 2}}}});
  ASSERT_EQ(gmod_train(0, cfg, {"schedule.exit_at_step=1"}), 0) << slurp(cfg + ".log");
  EXPECT_NE(gmod_train(0, cfg, {"schedule.exit_at_step=2", "seed=12", "batch.global_batch=8"}), 0);
  std::string log = slurp(cfg + ".log");
  EXPECT_NE(log.find("belongs to another run setup (2 changes)"), std::string::npos) << log;
  EXPECT_NE(log.find("seed: checkpoint 11, now 12"), std::string::npos) << log;
  EXPECT_NE(log.find("global batch: checkpoint 4, now 8"), std::string::npos) << log;
  EXPECT_FALSE(std::filesystem::exists(ckpt(run, 2)));
  ASSERT_EQ(gmod_train(0, cfg, {"schedule.exit_at_step=2", "seed=12", "resume_allow_changes=true"}), 0)
      << slurp(cfg + ".log");
  EXPECT_NE(slurp(cfg + ".log").find("resume_allow_changes=true: resuming anyway"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(ckpt(run, 2)));

  const std::string manifest = ckpt(run, 2) + "/manifest.json";
  json m = json::parse(slurp(manifest));
  m["format_version"] = 99;
  std::ofstream(manifest) << m.dump();
  EXPECT_NE(gmod_train(0, cfg, {"schedule.exit_at_step=3", "seed=12", "resume=" + ckpt(run, 2)}), 0);
  log = slurp(cfg + ".log");
  EXPECT_NE(log.find("format_version 99, this gmod reads format_version 1 (written by a newer gmod)"),
            std::string::npos) << log;
}

// Activation checkpointing under 2 ranks with the overlapped bucket reduction (the trainer's default) on the γ-MoD
// demo model: bitwise the same per-step losses, gradient norms and final weights as without checkpointing.
TEST(TrainE2E, ActivationCheckpointingTwoRanks) {
  TempDir t;
  const std::string ref = t.str("no_ckpt");
  const std::string overlap = "optimizer.overlap_comm=true";
  ASSERT_EQ(gmod_train(2, write_config(ref), {"schedule.max_steps=3", overlap}), 0) << slurp(ref + ".config.json.log");
  const auto mref = step_metrics(ref);
  ASSERT_EQ(mref.size(), 3u);
  for (const char* mode : {"full", "every_2"}) {
    SCOPED_TRACE(mode);
    const std::string run = t.str(std::string("ckpt_") + mode);
    const std::string set = std::string("model.activation_checkpointing=") + mode;
    ASSERT_EQ(gmod_train(2, write_config(run), {"schedule.max_steps=3", overlap, set}), 0)
        << slurp(run + ".config.json.log");
    EXPECT_NE(slurp(run + ".config.json.log").find(std::string("activation checkpointing ") + mode), std::string::npos);
    const auto m = step_metrics(run);
    for (int64_t k = 1; k <= 3; ++k)
      for (const char* f : {"loss", "lm_loss", "routing_loss", "grad_norm", "skip_ratio"})
        EXPECT_EQ(mref.at(k)[f].dump(), m.at(k)[f].dump()) << "step " << k << " " << f;
    expect_same_model(ckpt(ref, 3), ckpt(run, 3));
  }
}

namespace {

// A dataset file of `n` copies of `record` (a JSON object with "%d" where the index goes), next to the demo images.
std::string write_records(const TempDir& t, const std::string& name, int n, const std::string& record) {
  const std::string path = t.str(name);
  std::ofstream f(path);
  f << "[\n";
  for (int i = 0; i < n; ++i) {
    std::string r = record;
    r.replace(r.find("%d"), 2, std::to_string(i));
    f << r << (i + 1 < n ? ",\n" : "\n");
  }
  f << "]\n";
  return path;
}

const char* kMissingImageRecord =
    R"({"id": "m%d", "image": "images/missing.png", "conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A shape."}]})";
const char* kTextRecord =
    R"({"id": "t%d", "conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "4"}]})";

}  // namespace

// Unusable data stops the run before training (no checkpoint, no metrics), with the counts per kind, the same way
// on 1 and 2 ranks: every record unusable, and a usable share below data.max_bad_fraction.
TEST(TrainE2E, UnusableDataStopsBeforeTraining) {
  TempDir t;
  const std::string all_bad = write_records(t, "all_bad.json", 40, kMissingImageRecord);
  {
    const std::string run = t.str("all_bad_run");
    const std::string cfg = write_config(run, {{"data", {{"train", all_bad}, {"image_folder", env().data}}}});
    EXPECT_NE(gmod_train(0, cfg), 0);
    const std::string log = slurp(cfg + ".log");
    EXPECT_NE(log.find("data.train: " + all_bad + ": 40 of the first 40 of 40 records in training order are unusable "
                       "(100.0%; image: 40); none is usable, training would learn nothing"),
              std::string::npos) << log;
    EXPECT_NE(log.find("[image] " + all_bad + ": record "), std::string::npos) << log;
    EXPECT_FALSE(std::filesystem::exists(run + "/checkpoints"));
    EXPECT_FALSE(std::filesystem::exists(run + "/metrics.jsonl"));
    EXPECT_EQ(log.find("arank per layer"), std::string::npos) << "stopped before ARank: " << log;
  }
  // 36 good demo records + 4 bad = 10% > 5%, on 1 and 2 ranks; with max_bad_fraction = 0.2 it trains.
  std::ifstream in(env().data + "/train.json");
  json recs = json::parse(in);
  recs.erase(recs.begin() + 36, recs.end());
  for (int i = 0; i < 4; ++i) recs.push_back(json::parse(R"({"id": "bad", "conversations": [{"from": "human", "value": "Q"}]})"));
  const std::string some_bad = t.str("some_bad.json");
  std::ofstream(some_bad) << recs.dump(1);
  for (int np : {0, 2}) {
    const std::string run = t.str("some_bad_run" + std::to_string(np));
    const std::string cfg = write_config(run, {{"data", {{"train", some_bad}, {"image_folder", env().data}}}});
    EXPECT_NE(gmod_train(np, cfg), 0);
    const std::string log = slurp(cfg + ".log");
    EXPECT_NE(log.find("4 of the first 40 of 40 records in training order are unusable (10.0%; no_answer: 4), more "
                       "than data.max_bad_fraction = 0.05"),
              std::string::npos) << "np " << np << ": " << log;
    EXPECT_FALSE(std::filesystem::exists(run + "/checkpoints"));
  }
  const std::string run = t.str("some_bad_ok");
  const std::string cfg = write_config(run, {{"data", {{"train", some_bad}, {"image_folder", env().data},
                                                       {"max_bad_fraction", 0.2}}}});
  EXPECT_EQ(gmod_train(0, cfg, {"schedule.max_steps=1"}), 0) << slurp(cfg + ".log");
  EXPECT_NE(slurp(cfg + ".log").find("40 records in training order checked: 36 usable, 4 not (no_answer: 4)"),
            std::string::npos) << slurp(cfg + ".log");
}

// γ-MoD's ARank protocol measures image samples: a text-only dataset stops with a named error, not a hang.
TEST(TrainE2E, ArankWithoutImageSamplesIsANamedError) {
  TempDir t;
  const std::string text = write_records(t, "text.json", 40, kTextRecord);
  const std::string run = t.str("run");
  const std::string cfg = write_config(run, {{"data", {{"train", text}}}});
  EXPECT_NE(gmod_train(0, cfg, {"mod.rule=keep_top:2"}), 0);  // a rule that needs ARank
  const std::string log = slurp(cfg + ".log");
  EXPECT_NE(log.find(text + ": no sample usable for ARank among 40 records (40 text-only, 0 bad"), std::string::npos)
      << log;
  EXPECT_NE(log.find("ARank needs image samples"), std::string::npos) << log;
}

// A second job on a run dir in use fails at once naming the first (its pid); the first is not disturbed.
TEST(TrainE2E, SecondJobOnSameRunDirFailsAtOnce) {
  TempDir t;
  const std::string run = t.str("run");
  const std::string cfg = write_config(run, {{"schedule", {{"max_steps", 100000}}}, {"deterministic", false}});
  const std::string log = cfg + ".first.log";
  const pid_t pid = spawn_train(cfg, log);
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (step_metrics(run).empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_FALSE(step_metrics(run).empty()) << slurp(log);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(gmod_train(0, cfg, {"schedule.max_steps=100000", "deterministic=false"}), 0);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string second = slurp(cfg + ".log");
  EXPECT_NE(second.find("run_dir " + run + " is in use by another job (pid " + std::to_string(pid) + " on host "),
            std::string::npos) << second;
  EXPECT_LT(took, 30.0) << "the second job must fail before loading anything";
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << slurp(log);
  EXPECT_EQ(WEXITSTATUS(status), 0) << slurp(log);
  const int64_t last = step_metrics(run).rbegin()->first;
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, last)), "") << slurp(log);
}
