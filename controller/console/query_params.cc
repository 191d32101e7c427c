#include "controller/console/query_params.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"

namespace loom::controller::console {
namespace {

using google::protobuf::FieldDescriptor;

// Decodes %XX and '+' (a space in a query string). False for a broken escape.
bool UrlDecode(absl::string_view in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out->push_back(' ');
    } else if (in[i] == '%') {
      int v = 0;
      if (i + 2 >= in.size()) return false;
      for (int k = 1; k <= 2; ++k) {
        const char c = in[i + k];
        if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
        v = v * 16 + (absl::ascii_isdigit(static_cast<unsigned char>(c))
                          ? c - '0'
                          : absl::ascii_tolower(static_cast<unsigned char>(c)) - 'a' + 10);
      }
      out->push_back(static_cast<char>(v));
      i += 2;
    } else {
      out->push_back(in[i]);
    }
  }
  return true;
}
}  // namespace

absl::Status ParseQueryParams(const std::string& query, google::protobuf::Message* message) {
  const google::protobuf::Descriptor* d = message->GetDescriptor();
  const google::protobuf::Reflection* r = message->GetReflection();
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t eq = pair.find('=');
    std::string key, value;
    if (!UrlDecode(pair.substr(0, eq), &key) ||
        !UrlDecode(eq == absl::string_view::npos ? "" : pair.substr(eq + 1), &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("query: a broken %-escape in \"", std::string(pair), "\""));
    }
    const FieldDescriptor* f = d->FindFieldByName(key);
    if (f == nullptr) f = d->FindFieldByCamelcaseName(key);
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("query: unknown parameter \"", key, "\" (",
                                                     d->name(), " has no such field)"));
    }
    auto bad = [&](absl::string_view want) {
      return absl::InvalidArgumentError(
          absl::StrCat("query: ", key, ": \"", value, "\" is not ", want));
    };
    const bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        rep ? r->AddString(message, f, value) : r->SetString(message, f, value);
        break;
      case FieldDescriptor::CPPTYPE_INT32: {
        int32_t v;
        if (!absl::SimpleAtoi(value, &v)) return bad("an integer");
        rep ? r->AddInt32(message, f, v) : r->SetInt32(message, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        int64_t v;
        if (!absl::SimpleAtoi(value, &v)) return bad("an integer");
        rep ? r->AddInt64(message, f, v) : r->SetInt64(message, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT32: {
        uint32_t v;
        if (!absl::SimpleAtoi(value, &v)) return bad("a non-negative integer");
        rep ? r->AddUInt32(message, f, v) : r->SetUInt32(message, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t v;
        if (!absl::SimpleAtoi(value, &v)) return bad("a non-negative integer");
        rep ? r->AddUInt64(message, f, v) : r->SetUInt64(message, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: {
        double v;
        if (!absl::SimpleAtod(value, &v)) return bad("a number");
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
          rep ? r->AddDouble(message, f, v) : r->SetDouble(message, f, v);
        } else {
          rep ? r->AddFloat(message, f, static_cast<float>(v))
              : r->SetFloat(message, f, static_cast<float>(v));
        }
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        bool v;
        if (value == "true" || value == "1") {
          v = true;
        } else if (value == "false" || value == "0") {
          v = false;
        } else {
          return bad("true or false");
        }
        rep ? r->AddBool(message, f, v) : r->SetBool(message, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const google::protobuf::EnumValueDescriptor* e = f->enum_type()->FindValueByName(value);
        int number;
        if (e == nullptr && absl::SimpleAtoi(value, &number)) {
          e = f->enum_type()->FindValueByNumber(number);
        }
        if (e == nullptr) return bad(absl::StrCat("a value of ", f->enum_type()->name()));
        rep ? r->AddEnum(message, f, e) : r->SetEnum(message, f, e);
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        return absl::InvalidArgumentError(
            absl::StrCat("query: ", key, " is a message: send it in a POST body as JSON"));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::controller::console
