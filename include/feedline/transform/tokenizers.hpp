// feedline/transform/tokenizers.hpp: every tokenizer kind this build has, registered. One #include line
// per implementation: each header registers its kind with the tokenizer registry when included
// (transform/tokenizer.hpp), and is empty when its library was not found. Include this, not an
// implementation, to make tokenizers with make_tokenizer().
#pragma once

#include <feedline/transform/tokenizer.hpp>

#include <feedline/transform/feedline_tokenizer.hpp>  // first: kind "auto" prefers it where it reproduces the model
#include <feedline/transform/sentencepiece_tokenizer.hpp>
#include <feedline/transform/byte_level_bpe_tokenizer.hpp>  // tokenizer.json
