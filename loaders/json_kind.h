/* json_kind.h: the JSON type of a value in words, for error messages
 * ("... is a string, expected an integer"), shared by the loaders. */
#ifndef ENGINE_JSON_KIND_H
#define ENGINE_JSON_KIND_H

#include <jansson.h>

static inline const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

#endif
