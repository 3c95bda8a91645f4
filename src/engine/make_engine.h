// Picks the engine: resident (everything in device memory) or sliding (offloaded).
#pragma once
#include <memory>

#include "backend/device.h"
#include "engine/engine.h"

namespace sf {

std::unique_ptr<Engine> make_engine(Device& dev, const ModelSpec& spec, const EngineOptions& opt, bool offload,
                                    int slots);

}  // namespace sf
