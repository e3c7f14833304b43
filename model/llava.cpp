#include "model/llava.h"

#include <torch/nn/init.h>

#include <cmath>

#include "model/llava_next.h"

#include <sstream>

#include "model/mrope.h"
#include "model/segments.h"

namespace gmod {

namespace {
class Holder : public torch::nn::Module {};
}  // namespace

ProjectorImpl::ProjectorImpl(int64_t vision_dim, int64_t text_dim) {
  linear_1 = register_module("linear_1", std::make_shared<LinearImpl>(vision_dim, text_dim, true));
  linear_2 = register_module("linear_2", std::make_shared<LinearImpl>(text_dim, text_dim, true));
}

MultimodalLM::MultimodalLM(const LlavaConfig& c) : config(c) {
  llm = register_module("llm", std::make_shared<LlamaModel>(c.text));
  if (!c.text.tie_word_embeddings) {
    auto h = register_module("lm_head", std::make_shared<Holder>());
    lm_head = h->register_parameter("weight", at::empty({c.text.vocab_size, c.text.hidden_size}));
  }
  if (auto tower = make_vision_tower(c)) {
    vision = register_module("vision", tower);
    if (!vision->projects_to_text())
      projector =
          register_module("projector", std::make_shared<ProjectorImpl>(vision->feature_dim(), c.text.hidden_size));
    if (c.anyres) image_newline = register_parameter("image_newline", at::empty({c.text.hidden_size}));
  }
}

void MultimodalLM::init_weights(uint64_t seed, const std::string& prefix) {
  at::NoGradGuard ng;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : named_parameters()) {
    const auto& name = p.key();
    if (!prefix.empty() && name.rfind(prefix, 0) != 0) continue;
    auto& t = p.value();
    const bool vision_param = name.rfind("vision.", 0) == 0;
    if (vision_param && vision->init_parameter(name.substr(7), t, gen)) continue;
    if (name == "image_newline") {  // transformers and LLaVA: normal(0, 1 / sqrt(D))
      const double s = 1.0 / std::sqrt(static_cast<double>(config.text.hidden_size));
      t.copy_(at::normal(0.0, s, t.sizes(), gen, at::TensorOptions().dtype(at::kFloat)).to(t.dtype()));
      continue;
    }
    const double std = !vision_param ? config.text.initializer_range
                       : config.vision ? config.vision->initializer_range
                       : config.qwen_vision ? config.qwen_vision->initializer_range
                                            : config.qwen3_vision->initializer_range;
    auto ends = [&](const char* s) {
      std::string suf(s);
      return name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
    };
    const bool is_norm = name.find("norm") != std::string::npos || name.find("layrnorm") != std::string::npos;
    if (is_norm && ends(".weight")) t.fill_(1.0);
    else if (ends(".bias")) t.zero_();
    else t.copy_(at::normal(0.0, std, t.sizes(), gen, at::TensorOptions().dtype(at::kFloat)).to(t.dtype()));
    // transformers' _init_weights zeroes an embedding's padding_idx row (with a tied head that row is zero too).
    if (name == "llm.embed_tokens.weight" && llm->padding_idx >= 0) t[llm->padding_idx].zero_();
  }
}

at::Tensor MultimodalLM::image_features(const at::Tensor& pixel_values) {
  if (!vision) throw std::invalid_argument("image inputs given to a model without a vision tower");
  auto h = vision->features(pixel_values);  // [N, T, Dv]
  if (!projector) return h;
  return projector->forward(h.to(projector->linear_1->weight.scalar_type()));
}

at::Tensor MultimodalLM::image_token_features(const at::Tensor& pixel_values, const at::Tensor& grid_thw,
                                              const at::Tensor& image_sizes, std::vector<at::Tensor>* deepstack) {
  if (!vision) throw std::invalid_argument("image inputs given to a model without a vision tower");
  if (config.anyres) {  // LLaVA-NeXT: project every tile's patches, then pack them per image with the newline
    if (!image_sizes.defined())
      throw std::invalid_argument("an AnyRes (LLaVA-NeXT) model needs image_sizes with its images' tiles");
    auto f = projector->forward(vision->features(pixel_values).to(projector->linear_1->weight.scalar_type()));
    const int tile = vision->image_size(), side = tile / config.vision->patch_size;
    return pack_anyres_features(f, image_sizes, *config.anyres, tile, side, image_newline);
  }
  if (image_sizes.defined()) throw std::invalid_argument("image_sizes given to a model without AnyRes");
  auto h = deepstack ? vision->token_features_stacked(pixel_values, grid_thw, *deepstack)
                     : vision->token_features(pixel_values, grid_thw);  // [T, Dv]
  if (!projector) return h;
  return projector->forward(h.to(projector->linear_1->weight.scalar_type()));
}

at::Tensor MultimodalLM::embed_inputs(const at::Tensor& input_ids, const at::Tensor& pixel_values,
                                      const at::Tensor& grid_thw, const at::Tensor& image_sizes,
                                      const at::Tensor& pixel_values_videos, const at::Tensor& video_grid_thw,
                                      std::vector<at::Tensor>* deepstack) {
  auto is_img = input_ids == config.image_token_id;  // [B, L]
  check_token_ids(input_ids, is_img);
  // A model composed from parts keeps the LLM's vocabulary and uses id vocab_size as the image placeholder (as
  // LLaVA's IMAGE_TOKEN_INDEX): those rows are looked up as id 0 and then overwritten by image features.
  auto emb = llm->embed(config.image_token_id >= config.text.vocab_size ? input_ids.masked_fill(is_img, 0)
                                                                           : input_ids);  // [B, L, D]
  at::Tensor image_feats;  // set when images and videos went through the encoder together
  if (config.anyres && config.anyres->max_patches > 0 && pixel_values_videos.defined() &&
      pixel_values_videos.size(0) > 0) {
    // LLaVA-OneVision's videos (model/llava_next.h): one tower pass over the images' tiles and the videos' frames
    // (every encoder unit once a forward), then each packed its own way; the images' features are spliced below.
    const int64_t n_tiles = pixel_values.defined() ? pixel_values.size(0) : 0;
    const auto frames = n_tiles ? pixel_values_videos.to(pixel_values.scalar_type()) : pixel_values_videos;
    const auto f = projector->forward(vision->features(n_tiles ? at::cat({pixel_values, frames}) : frames)
                                          .to(projector->linear_1->weight.scalar_type()));
    const int tile = vision->image_size(), side = tile / config.vision->patch_size;
    if (n_tiles) {
      if (!image_sizes.defined())
        throw std::invalid_argument("an AnyRes (LLaVA-NeXT) model needs image_sizes with its images' tiles");
      image_feats = pack_anyres_features(f.narrow(0, 0, n_tiles), image_sizes, *config.anyres, tile, side,
                                         image_newline);
    }
    const auto vf = pack_onevision_video_features(f.narrow(0, n_tiles, f.size(0) - n_tiles), video_grid_thw, side,
                                                  image_newline);
    const auto is_vid = input_ids == config.anyres->video_token_id;
    const int64_t n_vid = is_vid.sum().item<int64_t>();
    if (n_vid != vf.size(0))
      throw std::invalid_argument("batch has " + std::to_string(n_vid) + " video-token positions (id " +
                                  std::to_string(config.anyres->video_token_id) + ") but " +
                                  std::to_string(frames.size(0)) + " video frames give " +
                                  std::to_string(vf.size(0)) + " video tokens");
    emb = emb.masked_scatter(is_vid.unsqueeze(-1), vf.to(emb.scalar_type()));
  } else if (pixel_values_videos.defined() && pixel_values_videos.size(0) > 0) {
    // Videos (Qwen2.5-VL, Qwen3-VL): their features replace the video token's positions in order. With images
    // as well, one encoder pass takes both (images first): attention never crosses an image or a video
    // (per-frame and window segments), so the features are those of transformers' separate get_image_features
    // / get_video_features, and every encoder unit runs once per forward (ZeRO-3 hooks, activation
    // checkpointing).
    if (!config.mrope || !vision)
      throw std::invalid_argument(
          "videos given to a model without video tokens (only Qwen2.5-VL and Qwen3-VL take "
          "videos)");
    if (!deepstack && config.qwen3_vision)  // a forward without them would silently compute another model
      throw std::invalid_argument(
          "Qwen3-VL: embedding videos needs somewhere to put their DeepStack features "
          "(embed_inputs' deepstack argument, then ForwardState::deepstack)");
    if (!video_grid_thw.defined() || video_grid_thw.dim() != 2 || video_grid_thw.size(1) != 3)
      throw std::invalid_argument("pixel_values_videos given without video_grid_thw [n_videos, 3]");
    const bool with_images = pixel_values.defined() && pixel_values.size(0) > 0;
    if (with_images && !grid_thw.defined())
      throw std::invalid_argument("videos with fixed-size images: only native-resolution images (image_grid_thw) "
                                  "mix with videos");
    at::Tensor feats = with_images
                           ? image_token_features(
                                 at::cat({pixel_values, pixel_values_videos.to(pixel_values.scalar_type())}),
                                 at::cat({grid_thw, video_grid_thw.to(grid_thw.device())}), {}, deepstack)
                           : image_token_features(pixel_values_videos, video_grid_thw, {}, deepstack);
    int64_t n_image_tokens = 0;
    if (with_images) {
      const int64_t m = config.mrope->spatial_merge_size;
      n_image_tokens = grid_thw.to(at::kCPU).prod(1).sum().item<int64_t>() / (m * m);
      image_feats = feats.narrow(0, 0, n_image_tokens);
    }
    const at::Tensor vf = feats.narrow(0, n_image_tokens, feats.size(0) - n_image_tokens);
    const auto is_vid = input_ids == config.mrope->video_token_id;
    const int64_t n_vid = is_vid.sum().item<int64_t>();
    if (n_vid != vf.size(0))
      throw std::invalid_argument("batch has " + std::to_string(n_vid) + " video-token positions (id " +
                                  std::to_string(config.mrope->video_token_id) + ") but " +
                                  std::to_string(pixel_values_videos.size(0)) + " video patches give " +
                                  std::to_string(vf.size(0)) + " video tokens");
    emb = emb.masked_scatter(is_vid.unsqueeze(-1), vf.to(emb.scalar_type()));
    if (deepstack && !deepstack->empty()) {
      // DeepStack rows come out images first, then videos; the LLM adds them at visual_positions() in
      // sequence order (transformers' Qwen3VLModel.forward joins them the same way).
      const at::Tensor at_video =
          is_vid.masked_select(visual_positions(input_ids)).to(at::kLong);  // [n_visual]
      const at::Tensor source = at::where(at_video.to(at::kBool), at_video.cumsum(0) - 1 + n_image_tokens,
                                          (1 - at_video).cumsum(0) - 1);
      for (auto& level : *deepstack) level = level.index_select(0, source.to(level.device()));
    }
  }
  if (!pixel_values.defined() || pixel_values.size(0) == 0) {
    if (config.image_token_id >= config.text.vocab_size && is_img.any().item<bool>())
      throw std::invalid_argument("batch has image-token positions (id " + std::to_string(config.image_token_id) +
                                  ") but no images");
    return emb;
  }
  if (!deepstack && config.qwen3_vision)  // a forward without them would silently compute another model
    throw std::invalid_argument("Qwen3-VL: embedding images needs somewhere to put their DeepStack features "
                                "(embed_inputs' deepstack argument, then ForwardState::deepstack)");
  auto feats =
      (image_feats.defined() ? image_feats : image_token_features(pixel_values, grid_thw, image_sizes, deepstack))
          .to(emb.scalar_type());  // [T, D]
  const int64_t n_pos = is_img.sum().item<int64_t>();
  if (n_pos != feats.size(0)) {
    std::ostringstream os;
    os << "batch has " << n_pos << " image-token positions (id " << config.image_token_id << ") but "
       << pixel_values.size(0) << (grid_thw.defined() ? " image patches" : image_sizes.defined() ? " tiles" : " images")
       << " give " << feats.size(0)
       << " image tokens";
    throw std::invalid_argument(os.str());
  }
  return emb.masked_scatter(is_img.unsqueeze(-1), feats);
}

at::Tensor MultimodalLM::visual_positions(const at::Tensor& input_ids) const {
  const auto is_img = input_ids == config.image_token_id;
  return config.mrope ? is_img | (input_ids == config.mrope->video_token_id) : is_img;
}

void MultimodalLM::check_token_ids(const at::Tensor& input_ids, const at::Tensor& is_img) const {
  // An id outside the vocabulary (LLaVA's -200 image marker given as text, a tokenizer larger than the model)
  // would be LibTorch's "index out of range in self" on the CPU and a device-side assert on CUDA: name it.
  const int64_t V = config.text.vocab_size;
  const auto bad = ((input_ids < 0) | (input_ids >= V)) & is_img.logical_not();
  if (!bad.any().item<bool>()) return;
  const auto where = bad.nonzero().cpu();  // [n, 2]
  const int64_t b = where[0][0].item<int64_t>(), t = where[0][1].item<int64_t>();
  throw std::invalid_argument("input_ids: " + std::to_string(where.size(0)) +
                              " token id(s) outside the vocabulary [0, " + std::to_string(V) + "), the first " +
                              std::to_string(input_ids[b][t].item<int64_t>()) + " at sample " + std::to_string(b) +
                              ", position " + std::to_string(t) + " (the image token is id " +
                              std::to_string(config.image_token_id) + ")");
}

void prepare_forward_state(ForwardState& st, const at::Tensor& input_ids, const at::Tensor& attention_mask,
                           const at::Tensor& positions) {
  const int64_t B = input_ids.size(0), L = input_ids.size(1);
  auto dev = input_ids.device();
  st.positions = positions.defined()
                     ? positions
                     : at::arange(L, at::TensorOptions().dtype(at::kLong).device(dev)).unsqueeze(0).expand({B, L});
  const bool padded = attention_mask.defined() && !attention_mask.all().item<bool>();
  st.key_valid = attention_mask.defined() ? attention_mask.to(at::kBool) : at::Tensor();
  // Right padding (every row's valid tokens form a prefix) needs no key mask: under the causal mask a real token
  // only sees earlier positions, which are all real. Padded rows compute garbage that nothing reads (labels -100,
  // routing and ARank use key_valid), and the fast fused causal kernel is used instead of a materialised mask.
  bool right_padded = true;
  if (padded && L > 1) {
    auto m = st.key_valid;
    right_padded = !(m.narrow(1, 1, L - 1) & m.narrow(1, 0, L - 1).logical_not()).any().item<bool>();
  }
  st.mask = padded && !right_padded ? AttentionMask::causal(st.key_valid, L, L, 0) : AttentionMask{};
  st.valid_tokens = attention_mask.defined() ? attention_mask.sum().item<int64_t>() : B * L;
}

void prepare_forward_state(ForwardState& st, const ModelInputs& in) {
  const int64_t B = in.input_ids.size(0), L = in.input_ids.size(1);
  if (!in.segments) {
    prepare_forward_state(st, in.input_ids, in.attention_mask, in.positions);
    st.token_roles = in.token_roles;
    // Once per forward, on the host: MoD layers take their capacities from these counts (no per-layer sync).
    st.host_role_counts = in.host_role_counts.defined() ? in.host_role_counts
                                                        : count_routing_roles(in.token_roles, st.key_valid, B, L);
    return;
  }
  in.segments->check(B, L, "packed batch");
  const auto dev = in.input_ids.device();
  st.positions = in.positions.defined() ? in.positions : in.segments->positions(L).to(dev);
  st.key_valid = in.attention_mask.defined() ? in.attention_mask.to(at::kBool) : at::Tensor();
  st.mask = AttentionMask{at::Tensor(), in.segments};
  st.segments = in.segments;
  std::tie(st.segment_index, st.segment_slots) = in.segments->view_index(L, dev);
  st.valid_tokens = st.key_valid.defined() ? st.key_valid.sum().item<int64_t>() : B * L;
  st.token_roles = in.token_roles;
  st.host_role_counts = in.host_role_counts.defined()
                            ? in.host_role_counts
                            : count_segment_roles(in.token_roles, st.key_valid, B, L, *in.segments);
  if (st.host_role_counts.size(0) != in.segments->num_segments())
    throw std::invalid_argument("packed batch: host_role_counts has " + std::to_string(st.host_role_counts.size(0)) +
                                " rows for " + std::to_string(in.segments->num_segments()) + " segments");
}

at::Tensor MultimodalLM::logits(const at::Tensor& hidden) const {
  return at::linear(hidden, lm_head_weight()).to(at::kFloat);
}

at::Tensor MultimodalLM::decoder_inputs(const ModelInputs& in, ForwardState& st) {
  const bool given_3d = in.positions.defined() && in.positions.dim() == 3;
  if (given_3d) {  // explicit M-RoPE positions: the temporal row stands for the 1-D ones (what MoD layers read)
    ModelInputs flat = in;
    flat.positions = in.positions.select(0, 0);
    prepare_forward_state(st, flat);
    st.mrope_positions = in.positions;
  } else {
    prepare_forward_state(st, in);
  }
  // A packed batch's 1-D positions (restarting per segment, data/pack.h) do not stand for 3-D ids: with images its
  // segments' ids are computed here as well.
  const bool visual = in.image_grid_thw.defined() || in.video_grid_thw.defined();
  if (!given_3d && config.mrope && visual && (!in.positions.defined() || in.segments)) {
    // As transformers: with images, every row's ids from get_rope_index; without, 0..L-1 (the 1-D default).
    if (!in.segments) {
      st.mrope_positions = mrope_positions(in.input_ids, in.attention_mask, in.image_grid_thw, in.video_grid_thw,
                                               in.second_per_grid_ts, *config.mrope)
                               .positions.to(in.input_ids.device());
    } else {  // packed rows (data.pack_to): each segment's ids as its own sample's, restarting at its first token
      const auto& vi = st.segment_index;
      auto seg_mask = st.segment_slots;
      if (st.key_valid.defined()) seg_mask = seg_mask & to_segment_view(st.key_valid, vi);
      const auto seg = mrope_positions(to_segment_view(in.input_ids, vi), seg_mask, in.image_grid_thw,
                                       in.video_grid_thw, in.second_per_grid_ts, *config.mrope)
                           .positions.to(in.input_ids.device());  // [3, S, Lmax]; images in segment order
      std::vector<at::Tensor> axes;
      for (int64_t a = 0; a < 3; ++a) axes.push_back(from_segment_view(seg[a], vi, st.segment_slots, st.positions));
      st.mrope_positions = at::stack(axes);  // [3, B, L]
    }
  }
  std::vector<at::Tensor> deepstack;
  auto emb = embed_inputs(in.input_ids, in.pixel_values, in.image_grid_thw, in.image_sizes, in.pixel_values_videos,
                          in.video_grid_thw, &deepstack);
  st.deepstack = deepstack;
  st.visual_mask = deepstack.empty() ? at::Tensor() : visual_positions(in.input_ids);
  return emb;
}

at::Tensor MultimodalLM::hidden_states(const ModelInputs& in, ForwardState& st) {
  const auto emb = decoder_inputs(in, st);
  return llm->forward(emb, st);
}

ModelOutput MultimodalLM::forward(const ModelInputs& in, ForwardState& st) {
  auto h = hidden_states(in, st);
  ModelOutput out;
  out.logits = logits(h);
  if (in.labels.defined()) {
    auto [sum, count] = causal_lm_loss_sum(out.logits, in.labels);
    out.lm_loss_sum = sum;
    out.supervised_tokens = count;
    out.lm_loss = sum / static_cast<double>(std::max<int64_t>(count, 1));
  }
  return out;
}

std::pair<at::Tensor, int64_t> causal_lm_loss_sum(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t L = logits.size(1), V = logits.size(2);
  auto lg = logits.narrow(1, 0, L - 1).reshape({-1, V}).to(at::kFloat);
  auto tg = labels.narrow(1, 1, L - 1).reshape({-1});
  auto sum = at::cross_entropy_loss(lg, tg, {}, at::Reduction::Sum, -100);
  return {sum, (tg != -100).sum().item<int64_t>()};
}

}  // namespace gmod
