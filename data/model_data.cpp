#include "data/model_data.h"

#include <filesystem>

#include "data/clip_preprocess.h"
#include "data/image_prep.h"
#include "data/video_prep.h"
#include "model/config.h"

namespace gmod {

void configure_for_model(DatasetConfig& dc, const LlavaConfig& model, const std::string& preprocessor_dir,
                         const std::shared_ptr<const Tokenizer>& tokenizer) {
  dc.conversation.image_token_id = model.image_token_id;
  dc.conversation.image_seq_length = model.vision ? model.image_seq_length() : 0;
  const auto pre = std::filesystem::path(preprocessor_dir) / "preprocessor_config.json";
  if (!preprocessor_dir.empty() && std::filesystem::exists(pre))
    dc.image = load_preprocess_config(pre.string());
  else if (model.vision)
    dc.image.size = dc.image.crop = model.image_input_size();
  if (model.multipath || model.mgm) dc.image.size = dc.image.crop = model.image_input_size();
  // Fixed-size crops, AnyRes tiles or native-resolution patches: decided once, from the model and its processor files.
  dc.image_preparer = make_image_preparer(model, dc.image, preprocessor_dir, *tokenizer);
  dc.conversation.image_first = dc.image_preparer->image_first();
  dc.video_preparer = make_video_preparer(model, preprocessor_dir, tokenizer);
  if (dc.image_preparer->size_dependent()) dc.conversation.image_seq_length = 1;
}

}  // namespace gmod
