/*
 * test_quant_bnb.h (part of test_quant.c): bitsandbytes' own 4-bit
 * quantization of given inputs, from tests/data/quant/bnb_4bit.json
 * (tests/fixtures/make_quant_fixtures.py, run where bitsandbytes and a GPU
 * are), reproduced bit for bit: code tables, dynamic map, packed nibbles,
 * absmax, nested codes and scales, and the dequantized values.
 */

/* Hex string of little-endian bytes into out[cap]; returns the byte count, or -1. */
static long unhex(const char *s, void *out, size_t cap)
{
    if (!s)
        return -1;
    const size_t len = strlen(s);
    if (len % 2 || len / 2 > cap)
        return -1;
    uint8_t *o = out;
    for (size_t i = 0; i < len / 2; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        o[i] = (uint8_t)v;
    }
    return (long)(len / 2);
}

/* A float array field of n values (hex of fp32) into a malloc'd buffer; NULL if malformed. */
static float *hex_floats(json_t *obj, const char *key, size_t n)
{
    float *f = malloc((n ? n : 1) * sizeof *f);
    if (f && unhex(json_string_value(json_object_get(obj, key)), f, n * sizeof *f) != (long)(n * sizeof *f)) {
        free(f);
        return NULL;
    }
    return f;
}

static size_t count_diff(const void *a, const void *b, size_t n, size_t elem)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem) != 0;
    return d;
}

static void check_bnb_case(json_t *c, const float bnb_map[256])
{
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *qt = json_string_value(json_object_get(c, "quant_type"));
    const size_t n = (size_t)json_integer_value(json_object_get(c, "n"));
    const int block = (int)json_integer_value(json_object_get(c, "blocksize"));
    const size_t nb = block > 0 ? (n + block - 1) / block : 0;
    CHECK_MSG(name && qt && n > 0 && block > 0 && block % 2 == 0, "bnb case malformed");
    if (!name || !qt || !n || block <= 0)
        return;
    const k_dtype type = strcmp(qt, "fp4") == 0 ? K_FP4 : K_NF4;
    float *x = hex_floats(c, "input_f32", n), *absmax = hex_floats(c, "absmax_f32", nb);
    float *deq = hex_floats(c, "dequant_f32", n);
    uint8_t *packed = malloc((n + 1) / 2);
    CHECK_MSG(x && absmax && deq && packed &&
                  unhex(json_string_value(json_object_get(c, "packed")), packed, (n + 1) / 2) == (long)((n + 1) / 2),
              "%s: malformed arrays", name);
    if (x && absmax && deq && packed) {
        uint8_t *my_packed = malloc((n + 1) / 2);
        float *my_absmax = malloc(nb * sizeof *my_absmax), *my_deq = malloc(n * sizeof *my_deq);
        q_4bit_quantize(type, x, n, block, my_packed, my_absmax, 2);
        size_t d1 = count_diff(my_packed, packed, (n + 1) / 2, 1), d2 = count_diff(my_absmax, absmax, nb, 4);
        CHECK_MSG(d1 == 0 && d2 == 0, "%s: %zu packed bytes and %zu absmax values differ from bitsandbytes", name, d1,
                  d2);
        q_4bit_dequantize(type == K_FP4 ? q_fp4_code : q_nf4_code, packed, absmax, n, block, my_deq, 2);
        d1 = count_diff(my_deq, deq, n, 4);
        CHECK_MSG(d1 == 0, "%s: %zu dequantized values differ from bitsandbytes", name, d1);

        json_t *nested = json_object_get(c, "nested");
        if (json_is_object(nested)) {
            const size_t nn = (nb + 255) / 256;
            float *nabs = hex_floats(nested, "nested_absmax_f32", nn), *ndeq = hex_floats(nested, "dequant_f32", n);
            float *off = hex_floats(nested, "offset_f32", 1);
            uint8_t *aq = malloc(nb), *my_aq = malloc(nb);
            float *my_nabs = malloc(nn * sizeof *my_nabs), *am_back = malloc(nb * sizeof *am_back);
            CHECK_MSG(nabs && ndeq && off &&
                          unhex(json_string_value(json_object_get(nested, "absmax_u8")), aq, nb) == (long)nb,
                      "%s: malformed nested arrays", name);
            if (nabs && ndeq && off) {
                /* Our offset is the mean in double; bitsandbytes' GPU mean may
                 * differ in the last bits, so the codes are compared from its offset. */
                float my_off;
                q_nested_quantize(bnb_map, absmax, nb, my_aq, my_nabs, &my_off);
                CHECK_MSG(fabsf(my_off - *off) <= 1e-6f * fabsf(*off), "%s: mean offset %.9g vs %.9g", name, my_off,
                          *off);
                float *centred = malloc(nb * sizeof *centred);
                for (size_t i = 0; i < nb; i++)
                    centred[i] = absmax[i] - *off;
                q_8bit_quantize(bnb_map, centred, nb, 256, my_aq, my_nabs);
                free(centred);
                d1 = count_diff(my_aq, aq, nb, 1);
                d2 = count_diff(my_nabs, nabs, nn, 4);
                CHECK_MSG(d1 == 0 && d2 == 0, "%s: %zu nested codes and %zu nested absmax differ", name, d1, d2);
                q_8bit_dequantize(bnb_map, aq, nabs, nb, 256, *off, am_back);
                q_4bit_dequantize(type == K_FP4 ? q_fp4_code : q_nf4_code, packed, am_back, n, block, my_deq, 2);
                d1 = count_diff(my_deq, ndeq, n, 4);
                CHECK_MSG(d1 == 0, "%s: %zu values dequantized through the nested absmax differ", name, d1);
            }
            free(nabs), free(ndeq), free(off), free(aq), free(my_aq), free(my_nabs), free(am_back);
        }
        free(my_packed), free(my_absmax), free(my_deq);
    }
    free(x), free(absmax), free(deq), free(packed);
}

static void test_bnb_fixture(void)
{
    char path[1024];
    test_data_path(path, sizeof path, "quant/bnb_4bit.json");
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        printf("test_quant: SKIP bitsandbytes bit-exact checks: %s is absent "
               "(make it with tests/fixtures/make_quant_fixtures.py on a machine with bitsandbytes and a GPU)\n",
               path);
        return;
    }
    fclose(probe);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    CHECK_MSG(root != NULL, "%s: %s", path, je.text);
    if (!root)
        return;
    float nf4[16], fp4[16], map[256], mine[256];
    CHECK(unhex(json_string_value(json_object_get(root, "nf4_code_f32")), nf4, sizeof nf4) == sizeof nf4 &&
          count_diff(nf4, q_nf4_code, 16, 4) == 0);
    /* bitsandbytes' FP4 quant_map holds +0 at code 8 while its kernels decode
     * code 8 to -0 (the dequantized values below show it); ours follows the
     * kernels, so the table is compared by value here, bit for bit below. */
    int fp4_same = unhex(json_string_value(json_object_get(root, "fp4_code_f32")), fp4, sizeof fp4) == sizeof fp4;
    for (int i = 0; i < 16 && fp4_same; i++)
        fp4_same = fp4[i] == q_fp4_code[i];
    CHECK(fp4_same);
    const int have_map = unhex(json_string_value(json_object_get(root, "dynamic_map_f32")), map, sizeof map) ==
                         sizeof map;
    CHECK(have_map);
    q_dynamic_map(mine);
    const size_t dm = have_map ? count_diff(mine, map, 256, 4) : 256;
    CHECK_MSG(dm == 0, "dynamic map: %zu of 256 entries differ from bitsandbytes' create_dynamic_map()", dm);
    size_t k;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), k, c)
        check_bnb_case(c, have_map ? map : mine);
    CHECK(json_array_size(json_object_get(root, "cases")) > 0);
    json_decref(root);
}
