// The command-line option of each Setting: the one place the lower layers' settings get their
// option names. The CLI renders every InputError with it (InputError::message(option_name)).
#pragma once
#include "core/error.h"

namespace sf {

// "--seq-len" for Setting::SeqLen; every Setting has one.
const char* option_name(Setting s);

}  // namespace sf
