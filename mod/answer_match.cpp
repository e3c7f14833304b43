// See answer_match.h.
#include "mod/answer_match.h"

#include <torch/torch.h>

#include "mod/generate.h"

namespace gmod {

std::pair<int64_t, int64_t> first_answer_exact_match(MultimodalLM& model, const ModelInputs& in) {
  int64_t hits = 0, counted = 0, image_offset = 0;
  const at::Tensor ids = in.input_ids.cpu(), labels = in.labels.cpu();
  const int64_t per_image = model.config.vision ? model.config.image_seq_length() : 0;
  for (int64_t b = 0; b < ids.size(0); ++b) {
    const at::Tensor row_ids = ids[b], row_labels = labels[b];
    const int64_t n_images = per_image > 0 ? row_ids.eq(model.config.image_token_id).sum().item<int64_t>() / per_image : 0;
    const at::Tensor sup = row_labels.ne(-100).nonzero().reshape({-1});
    if (sup.numel() == 0) {
      image_offset += n_images;
      continue;
    }
    const int64_t start = sup[0].item<int64_t>();
    int64_t end = start;
    while (end < row_labels.size(0) && row_labels[end].item<int64_t>() != -100) ++end;
    ModelInputs prompt;
    prompt.input_ids = in.input_ids.narrow(0, b, 1).narrow(1, 0, start);
    if (in.token_roles.defined()) prompt.token_roles = in.token_roles.narrow(0, b, 1).narrow(1, 0, start);
    if (n_images > 0) prompt.pixel_values = in.pixel_values.narrow(0, image_offset, n_images);
    image_offset += n_images;
    GenerateOptions g;
    g.max_new_tokens = end - start;
    g.eos_token_id = -1;  // generate exactly the answer's length
    const GenerateResult r = generate(model, prompt, g);
    hits += r.tokens.cpu()[0].narrow(0, 0, end - start).equal(row_ids.narrow(0, start, end - start)) ? 1 : 0;
    ++counted;
  }
  return {hits, counted};
}

}  // namespace gmod
