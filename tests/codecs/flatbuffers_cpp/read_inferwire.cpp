// Reads inferwire's FlatBuffers with the C++ reader flatc generates from schemas/inferwire.fbs
// (tests/codecs/test_flatbuffers_cpp.py compiles it). For each file named on the command line: verify
// it as a size-prefixed Envelope with the identifier "IWF1", then print its payload as one line
// of JSON. Floats are printed as C99 hex floats ("%a") in strings, so the test compares bits.
// An absent string, vector or table is null: "absent" and "empty" are told apart, as the codec
// tells them. Exit status 1 if a file fails verification.

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "inferwire_generated.h"

namespace fb = inferwire::schemas::fb;

static std::string quoted(const char *data, size_t size) {
  std::string out = "\"";
  for (size_t i = 0; i < size; ++i) {
    unsigned char c = static_cast<unsigned char>(data[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\u%04x", c);
      out += escape;
    } else {
      out += static_cast<char>(c);  // UTF-8 passes through
    }
  }
  return out + "\"";
}

static std::string string_or_null(const flatbuffers::String *s) {
  return s == nullptr ? "null" : quoted(s->c_str(), s->size());
}

static std::string hex_float(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "\"%a\"", value);
  return text;
}

template <typename T>
static std::string integers(const flatbuffers::Vector<T> *v, const char *format) {
  if (v == nullptr) return "null";
  std::string out = "[";
  for (flatbuffers::uoffset_t i = 0; i < v->size(); ++i) {
    char number[32];
    std::snprintf(number, sizeof number, format, v->Get(i));
    out += (i ? "," : "") + std::string(number);
  }
  return out + "]";
}

static std::string usage(const fb::Usage *u) {
  if (u == nullptr) return "null";
  char text[96];
  std::snprintf(text, sizeof text, "{\"prompt_tokens\":%" PRIu32 ",\"completion_tokens\":%" PRIu32 "}",
                u->prompt_tokens(), u->completion_tokens());
  return text;
}

static std::string token_chunk(const fb::TokenChunk *c) {
  std::string logprobs = "null";
  if (c->logprobs() != nullptr) {
    logprobs = "[";
    for (flatbuffers::uoffset_t i = 0; i < c->logprobs()->size(); ++i) {
      const fb::TokenLogprob *lp = c->logprobs()->Get(i);
      std::string top = "null";
      if (lp->top() != nullptr) {
        top = "[";
        for (flatbuffers::uoffset_t j = 0; j < lp->top()->size(); ++j) {
          const fb::TopLogprob *t = lp->top()->Get(j);
          top += (j ? "," : "") + std::string("{\"token\":") + string_or_null(t->token()) +
                 ",\"logprob\":" + hex_float(t->logprob()) + "}";
        }
        top += "]";
      }
      logprobs += (i ? "," : "") + std::string("{\"token\":") + string_or_null(lp->token()) +
                  ",\"logprob\":" + hex_float(lp->logprob()) + ",\"top\":" + top + "}";
    }
    logprobs += "]";
  }
  char numbers[160];
  std::snprintf(numbers, sizeof numbers,
                "\"created\":%" PRId64 ",\"index\":%" PRIu32 ",\"seq\":%" PRIu64, c->created(),
                c->index(), c->seq());
  return std::string("{\"id\":") + string_or_null(c->id()) +
         ",\"model\":" + string_or_null(c->model()) + "," + numbers +
         ",\"token_ids\":" + integers(c->token_ids(), "%" PRIu32) +
         ",\"text\":" + string_or_null(c->text()) + ",\"logprobs\":" + logprobs +
         ",\"finish_reason\":" + string_or_null(c->finish_reason()) +
         ",\"usage\":" + usage(c->usage()) + "}";
}

static std::string tensors(
    const flatbuffers::Vector<flatbuffers::Offset<fb::Tensor>> *v) {
  if (v == nullptr) return "null";
  std::string out = "[";
  for (flatbuffers::uoffset_t i = 0; i < v->size(); ++i) {
    const fb::Tensor *t = v->Get(i);
    std::string data = "null";
    if (t->data() != nullptr) {
      data = "\"";
      for (uint8_t byte : *t->data()) {
        char pair[3];
        std::snprintf(pair, sizeof pair, "%02x", byte);
        data += pair;
      }
      data += "\"";
    }
    out += (i ? "," : "") + std::string("{\"name\":") + string_or_null(t->name()) +
           ",\"datatype\":" + string_or_null(t->datatype()) +
           ",\"shape\":" + integers(t->shape(), "%" PRId64) + ",\"data\":" + data + "}";
  }
  return out + "]";
}

static std::string embedding_batch(const fb::EmbeddingBatch *e) {
  std::string vectors = "null";
  if (e->vectors() != nullptr) {
    vectors = "[";
    for (flatbuffers::uoffset_t i = 0; i < e->vectors()->size(); ++i) {
      vectors += (i ? "," : "") + hex_float(e->vectors()->Get(i));
    }
    vectors += "]";
  }
  char numbers[64];
  std::snprintf(numbers, sizeof numbers, "\"batch\":%" PRIu32 ",\"dim\":%" PRIu32, e->batch(),
                e->dim());
  return std::string("{\"model\":") + string_or_null(e->model()) + "," + numbers +
         ",\"vectors\":" + vectors + ",\"usage\":" + usage(e->usage()) + "}";
}

static std::string payload(const fb::Envelope *envelope) {
  switch (envelope->payload_type()) {
    case fb::Payload_TokenChunk:
      return token_chunk(envelope->payload_as_TokenChunk());
    case fb::Payload_EmbeddingBatch:
      return embedding_batch(envelope->payload_as_EmbeddingBatch());
    case fb::Payload_InferRequest: {
      const fb::InferRequest *r = envelope->payload_as_InferRequest();
      return std::string("{\"model\":") + string_or_null(r->model()) +
             ",\"id\":" + string_or_null(r->id()) + ",\"inputs\":" + tensors(r->inputs()) + "}";
    }
    case fb::Payload_InferResponse: {
      const fb::InferResponse *r = envelope->payload_as_InferResponse();
      return std::string("{\"model\":") + string_or_null(r->model()) +
             ",\"id\":" + string_or_null(r->id()) + ",\"outputs\":" + tensors(r->outputs()) +
             "}";
    }
    default:
      return "null";
  }
}

int main(int argc, char **argv) {
  int status = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream file(argv[i], std::ios::binary);
    std::vector<uint8_t> buffer((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
    flatbuffers::Verifier verifier(buffer.data(), buffer.size());
    if (!fb::VerifySizePrefixedEnvelopeBuffer(verifier)) {
      std::fprintf(stderr, "%s: not a size-prefixed Envelope with identifier %s\n", argv[i],
                   fb::EnvelopeIdentifier());
      status = 1;
      continue;
    }
    const fb::Envelope *envelope = fb::GetSizePrefixedEnvelope(buffer.data());
    std::printf("{\"type\":\"%s\",\"payload\":%s}\n", fb::EnumNamePayload(envelope->payload_type()),
                payload(envelope).c_str());
  }
  return status;
}
