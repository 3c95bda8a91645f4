#include "engine/make_engine.h"

#include "core/error.h"
#include "engine/resident_engine.h"
#include "engine/sliding_engine.h"

namespace sf {

std::unique_ptr<Engine> make_engine(Device& dev, const ModelSpec& spec, const EngineOptions& opt, bool offload,
                                    int slots) {
  if (!offload) return std::make_unique<ResidentEngine>(dev, spec, opt);
  if (slots < 2) input_error("--slots", "the sliding engine needs at least 2 GPU parameter slots");
  SlidingOptions so;
  so.base = opt;
  so.slots = slots;
  return std::make_unique<SlidingEngine>(dev, spec, so);
}

}  // namespace sf
