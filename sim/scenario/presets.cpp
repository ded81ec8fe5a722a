// Model and GPU presets: public figures of the models and accelerators the study uses.
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "sim/scenario.hpp"
#include "sim/text.hpp"

namespace hpz {
namespace {

/** A decoder of Llama's architecture (ModelConfig's defaults for the rest). */
ModelConfig decoder(const char* name, int layers, int hidden, int ffn, int heads, int kv_heads,
                    int vocab) {
  ModelConfig m;
  m.name = name;
  m.layers = layers;
  m.hidden = hidden;
  m.ffn = ffn;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.vocab = vocab;
  return m;
}

/** Falcon-40B (tiiuae/falcon-40b's config.json: new_decoder_architecture, parallel attention,
 *  no Linear biases): a 2-matrix MLP, two LayerNorms (with biases) per layer, the output layer
 *  tied to the word embeddings (FalconConfig's default). */
ModelConfig falcon_40b() {
  ModelConfig m = decoder("falcon-40b", 60, 8192, 32768, 128, 8, 65024);
  m.family = "falcon";
  m.gated_mlp = false;
  m.norm_bias = true;
  m.tied_embeddings = true;
  m.parallel_blocks = true;
  return m;
}

/** A model preset: the decoder shape as published in the model's Hugging Face config. */
const std::vector<ModelConfig>& model_presets() {
  // name, layers, hidden, ffn, heads, kv_heads, vocab
  static const std::vector<ModelConfig> presets = {
      decoder("llama2-7b", 32, 4096, 11008, 32, 32, 32000),
      decoder("llama2-13b", 40, 5120, 13824, 40, 40, 32000),
      decoder("llama2-70b", 80, 8192, 28672, 64, 8, 32000),
      falcon_40b(),
      decoder("tiny", 2, 64, 128, 4, 4, 256),
  };
  return presets;
}

/** A GPU preset: dense bf16 peak, HBM bandwidth and memory from the vendors' data sheets. */
const std::vector<GpuSpec>& gpu_presets() {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  static const std::vector<GpuSpec> presets = {
      {"a100-80g", 312e12, 2.039e12, 80 * kGiB},
      {"h100-sxm", 989e12, 3.35e12, 80 * kGiB},
      {"h200", 989e12, 4.8e12, 141e9},
  };
  return presets;
}

template <typename T>
std::vector<std::string> names_of(const std::vector<T>& presets) {
  std::vector<std::string> names;
  for (const T& preset : presets) names.push_back(preset.name);
  return names;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  return names_of(model_presets());
}

std::vector<std::string> gpu_preset_names() {
  return names_of(gpu_presets());
}

ModelConfig model_preset(const std::string& name) {
  for (const ModelConfig& preset : model_presets()) {
    if (preset.name == name) return preset;
  }
  throw InputError("", "model.preset",
                   "unknown preset '" + name + "' (allowed: " + joined(model_preset_names()) + ")");
}

GpuSpec gpu_preset(const std::string& name) {
  for (const GpuSpec& preset : gpu_presets()) {
    if (preset.name == name) return preset;
  }
  throw InputError("", "cluster.gpu",
                   "unknown preset '" + name + "' (allowed: " + joined(gpu_preset_names()) + ")");
}

}  // namespace hpz
