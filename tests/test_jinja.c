/*
 * test_jinja: the interpreter construct by construct. The table's expected
 * strings are what Jinja2 3.1 renders in transformers' setup (an immutable
 * sandbox with trim_blocks, lstrip_blocks, loop controls, json.dumps as
 * tojson) for the context CTX below; NULL means Jinja2 raised. Then syntax
 * error positions, raise_exception's message and the limits.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "jinja/jinja.h"
#include "tests/test_util.h"

static const char *CTX =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi \\\"there\\\" \\u2014 \\u00fc\"}, {\"role\": \"assistant\", \"content\": \"Hello\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [true, null, 2.5]}}}]}], \"s\": \"  Hello World  \", \"n\": 7, \"f\": 2.5, \"l\": [3, 1, 2], \"d\": {\"b\": 1, \"a\": 2}, \"e\": [], \"t\": true, \"z\": null, \"words\": [\"b\", \"A\", \"a\", \"c\"]}";

static const struct {
    const char *src, *want;
} CASES[] = {
    {"a\n{% if t %}\nyes\n{% endif %}\nb", "a\nyes\nb"},
    {"a\n  {% if t %}\n  yes\n  {% endif %}\nb", "a\n  yes\nb"},
    {"a  {% if t %}x{% endif %}  b", "a  x  b"},
    {"a\n  {%+ if t %}x{% endif %}\nb", "a\n  xb"},
    {"a\n{% if t +%}\nx{% endif %}", "a\n\nx"},
    {"a  {{- 'x' -}}  b", "axb"},
    {"a  {{ 'x' }}\n  b", "a  x\n  b"},
    {"a \n {%- if t -%} \n x \n {%- endif -%} \n b", "axb"},
    {"a\n  {# c #}\nb", "a\nb"},
    {"a  {#- c -#}  b", "ab"},
    {"a\n{# c #}b\n", "a\nb"},
    {"x\n\n", "x\n"},
    {"{% for i in l %}\n  {{ i }}\n{% endfor %}\n", "  3\n  1\n  2\n"},
    {"  {% set x = 1 %}  {{ x }}", "  1"},
    {"{{ none }}|{{ None }}|{{ true }}|{{ False }}|{{ 1 }}|{{ 1.0 }}|{{ 1e20 }}|{{ 0.1 + 0.2 }}|{{ 1.5e-7 }}|{{ -0.0 }}", "None|None|True|False|1|1.0|1e+20|0.30000000000000004|1.5e-07|-0.0"},
    {"{{ [1, 'a', none, true, 2.0] }}|{{ {'k': 'v', 'q': \"it's\"} }}|{{ (1,) }}|{{ (1, 2) }}", "[1, 'a', None, True, 2.0]|{'k': 'v', 'q': \"it's\"}|(1,)|(1, 2)"},
    {"{{ 'a\\nb\\t\\'c\\\\' }}|{{ \"\\u00fc\\x41\" }}|{{ 'a' 'b' }}", "a\nb\t'c\\|\303\274A|ab"},
    {"{{ undefined_thing }}|{{ d.missing }}|{{ l[10] }}|{{ z.x }}", "|||"},
    {"{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 3 * 'ab' }} {{ 'a' ~ 1 ~ none }}", "3 -4 1 2 3.5 1024 ababab a1None"},
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 1 < 2 }} {{ 'b' > 'a' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1,2] == [1,2] }}", "7 9 True True True True True"},
    {"{{ 'ell' in 'hello' }} {{ 2 in l }} {{ 'a' in d }} {{ 'x' not in d }} {{ not t }} {{ t and n }} {{ z or 'dflt' }}", "True True True True False 7 dflt"},
    {"{{ 'y' if t else 'n' }} {{ 'y' if z else 'n' }} [{{ 'y' if z }}]", "y n []"},
    {"{{ l[0] }} {{ l[-1] }} {{ l[1:] }} {{ l[::-1] }} {{ l[:2] }} {{ s[2:7] }} {{ 'h\303\251llo'[1] }} {{ 'h\303\251llo'[::-1] }}", "3 2 [1, 2] [2, 1, 3] [3, 1] Hello \303\251 oll\303\251h"},
    {"{{ d['a'] }} {{ d.b }} {{ messages[0].role }} {{ messages[2]['tool_calls'][0].function.name }}", "2 1 system f"},
    {"{{ l + [4] }} {{ 'a' + 'b' }} {{ -n }} {{ +f }}", "[3, 1, 2, 4] ab -7 2.5"},
    {"{% if n > 5 %}big{% elif n > 2 %}mid{% else %}small{% endif %}", "big"},
    {"{% if n > 50 %}big{% elif n > 2 %}mid{% else %}small{% endif %}", "mid"},
    {"{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;"},
    {"{% for x in l %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", "-1;3-2;1-;"},
    {"{% for x in e %}x{% else %}empty{% endfor %}", "empty"},
    {"{% for x in l if x > 1 %}{{ x }}{{ loop.index }}{{ loop.last }};{% endfor %}", "31False;22True;"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "b=1;a=2;"},
    {"{% for k in d %}{{ k }}{% endfor %}", "ba"},
    {"{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}", "3"},
    {"{% for a in [1,2] %}{% for b in [3,4] %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}", "1311421;2312422;"},
    {"{% set x = 1 %}{% for i in l %}{% set x = i %}{% endfor %}{{ x }}", "1"},
    {"{% set ns = namespace(x=1, y='a') %}{% for i in l %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}{{ ns.y }}", "7a"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}", "12"},
    {"{% macro m(a, b='B', c=none) %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m('x', b='y') }}", "[1BNone][12None][1B3][xyNone]"},
    {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(4) }}", "4321"},
    {"{% for x in 'ab' %}{{ x }}{% endfor %}{% for x in undefined_thing %}u{% endfor %}", "ab"},
    {"{% if undefined_thing %}y{% else %}n{% endif %}{{ undefined_thing | length }}", "n0"},
    {"{{ l | length }} {{ 'h\303\251llo' | length }} {{ d | count }} {{ s | trim }}|{{ s | upper }}|{{ s | lower }}|{{ 'hello world' | capitalize }}|{{ 'hello woRld' | title }}", "3 5 2 Hello World|  HELLO WORLD  |  hello world  |Hello world|Hello World"},
    {"{{ l | join(', ') }} {{ l | first }} {{ l | last }} {{ l | list }} {{ l | sort }} {{ l | sort(reverse=true) }} {{ words | sort }} {{ words | unique | list }}", "3, 1, 2 3 2 [3, 1, 2] [1, 2, 3] [3, 2, 1] ['A', 'a', 'b', 'c'] ['b', 'A', 'c']"},
    {"{{ undefined_thing | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ z | d('x') }}", "d  d None"},
    {"{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | join(',') }}", "1 system,assistant"},
    {"{{ messages | selectattr('tool_calls', 'defined') | map(attribute='content') | list }} {{ messages | map(attribute='nope', default='-') | join }}", "['Hello'] ---"},
    {"{{ ['a', 'b', 'c'] | reject('equalto', 'b') | join('') }} {{ [1, 0, 2] | select | list }} {{ ['a','b'] | map('upper') | join }}", "ac [1, 2] AB"},
    {"{{ '3' | int + 1 }} {{ 3.9 | int }} {{ 'x' | int }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ -3 | abs }} {{ 5 | string ~ 'x' }} {{ 'a-b' | replace('-', '+') }}", "4 3 0 2.57 2.0 3 5x a+b"},
    {"{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'x' | safe }}|{{ d | items | list }}", "a\n  b\n\n  c|  a\n  b|x|[('b', 1), ('a', 2)]"},
    {"{{ messages[2].tool_calls[0].function.arguments | tojson }}", "{\"a\": 1, \"b\": [true, null, 2.5]}"},
    {"{{ messages[1] | tojson }}|{{ {'k': [1, {'x': none}], 'e': [], 'o': {}} | tojson(indent=2) }}", "{\"role\": \"user\", \"content\": \"Hi \\\"there\\\" \342\200\224 \303\274\"}|{\n  \"k\": [\n    1,\n    {\n      \"x\": null\n    }\n  ],\n  \"e\": [],\n  \"o\": {}\n}"},
    {"{{ 'q\"\\\\/\\n\\t\\x01\\x7f \303\251' | tojson }}|{{ d | tojson(sort_keys=true) }}|{{ f | tojson }}|{{ '\303\251' | tojson(ensure_ascii=true) }}", "\"q\\\"\\\\/\\n\\t\\u0001\177 \303\251\"|{\"a\": 2, \"b\": 1}|2.5|\"\\u00e9\""},
    {"{{ n is defined }} {{ nope is defined }} {{ nope is undefined }} {{ z is none }} {{ s is string }} {{ d is mapping }} {{ l is iterable }} {{ n is iterable }}", "True False True True True True True False"},
    {"{{ n is number }} {{ l is sequence }} {{ t is boolean }} {{ t is true }} {{ t is false }} {{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 'a' is in 'abc' }} {{ n is not none }}", "True True True True False True False True True True"},
    {"{{ messages[0].content is defined }} {{ messages[0].nope is defined }} {{ d.a is equalto 2 }}", "True False True"},
    {"{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}", "Hello World|Hello World  |  Hello World|hi|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']"},
    {"{{ s.startswith('  He') }} {{ s.endswith(('x', '  ')) }} {{ 'Ab'.upper() }} {{ 'Ab'.lower() }} {{ 'ab ab'.replace('a', 'x') }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }}", "True True AB ab xb xb Hello World Hello"},
    {"{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 5) }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}", "2 None 5 ['b', 'a'] [1, 2] [('b', 1), ('a', 2)]"},
    {"{{ range(3) | list }} {{ range(1, 10, 3) | list }} {% set x = dict(a=1) %}{{ x }}", "[0, 1, 2] [1, 4, 7] {'a': 1}"},
    {"{{ raise_exception('boom') }}", NULL}, /* TemplateError: boom */
    {"{{ nope.attr }}", NULL}, /* UndefinedError: 'nope' is undefined */
    {"{{ nope() }}", NULL}, /* UndefinedError: 'nope' is undefined */
    {"{{ 1 + nope }}", NULL}, /* UndefinedError: 'nope' is undefined */
    {"{{ 1 + 'a' }}", NULL}, /* TypeError: unsupported operand type(s) for +: 'int' and 'str' */
    {"{{ l.append(4) }}", NULL}, /* SecurityError: access to attribute 'append' of 'list' object is unsafe. */
    {"{% for x in n %}{% endfor %}", NULL}, /* TypeError: 'int' object is not iterable */
    {"{{ nope < 1 }}", NULL}, /* UndefinedError: 'nope' is undefined */
    {"{{ nope | tojson }}", NULL}, /* TypeError: Object of type Undefined is not JSON serializable */
    {"{{ 1 / 0 }}", NULL}, /* ZeroDivisionError: division by zero */
    {"{{ nope['x'] }}", NULL}, /* UndefinedError: 'nope' is undefined */
    {"{% set x = 1 %}{% set x.a = 2 %}", NULL}, /* TemplateRuntimeError: cannot assign attribute on non-namespace object */
};

/* Renders src with ctx (JSON text) and lim; returns the output (malloc'd) or NULL with err. */
static char *render(const char *src, const char *ctx, const jinja_limits *lim, char *err, size_t err_size)
{
    jinja_template *t = jinja_parse(src, strlen(src), err, err_size);
    if (!t)
        return NULL;
    json_error_t je;
    json_t *c = json_loads(ctx ? ctx : "{}", 0, &je);
    char *out = NULL;
    size_t n = 0;
    if (jinja_render(t, c, lim, &out, &n, err, err_size) != 0)
        out = NULL;
    else if (strlen(out) != n)
        CHECK_MSG(0, "%s: out_len %zu differs from strlen %zu", src, n, strlen(out));
    json_decref(c);
    jinja_free(t);
    return out;
}

static void table(void)
{
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        char err[512];
        char *out = render(CASES[i].src, CTX, NULL, err, sizeof err);
        if (CASES[i].want) {
            CHECK_MSG(out && !strcmp(out, CASES[i].want), "%s\n  got:  %s\n  want: %s", CASES[i].src,
                      out ? out : err, CASES[i].want);
        } else {
            CHECK_MSG(!out, "%s: rendered \"%s\", Jinja2 raises", CASES[i].src, out);
            CHECK_MSG(out || (!strncmp(err, "line ", 5) && !strchr(err, '\n')), "%s: error \"%s\"", CASES[i].src, err);
        }
        free(out);
    }
}

static void syntax_errors(void)
{
    static const struct {
        const char *src, *where;
    } E[] = {
        {"{{ 1 + }}", "line 1, column 8:"},
        {"a\nb {% if x %}", "line 2, column 13: unexpected end of template, expected 'endif'"},
        {"\n\n  {{ 'abc }}", "line 3, column 6:"},
        {"{% for x in %}{% endfor %}", "line 1, column 13:"},
        {"{% endif %}", "line 1, column 4:"},
        {"x {# never closed", "line 1, column 3:"},
        {"{{ x", "line 1, column 3:"},
        {"{% frobnicate %}", "line 1, column 4:"},
        {"{{ a ? b }}", "line 1, column 6:"},
        {"{% macro m(a=1, b) %}{% endmacro %}", "line 1, column 18:"},
    };
    for (size_t i = 0; i < sizeof E / sizeof *E; i++) {
        char err[256] = "";
        jinja_template *t = jinja_parse(E[i].src, strlen(E[i].src), err, sizeof err);
        CHECK_MSG(!t, "%s parsed", E[i].src);
        CHECK_MSG(!strncmp(err, E[i].where, strlen(E[i].where)), "%s: \"%s\", want \"%s...\"", E[i].src, err,
                  E[i].where);
        jinja_free(t);
    }
    /* deep nesting is refused at parse time, not by exhausting the stack */
    size_t n = 100000;
    char *deep = malloc(2 * n + 8);
    memcpy(deep, "{{", 2);
    memset(deep + 2, '(', n);
    memcpy(deep + 2 + n, "1", 1);
    memset(deep + 3 + n, ')', n);
    memcpy(deep + 3 + 2 * n, "}}", 3);
    char err[256];
    jinja_template *t = jinja_parse(deep, strlen(deep), err, sizeof err);
    CHECK_MSG(!t && strstr(err, "too deep"), "deep nesting: %s", t ? "parsed" : err);
    jinja_free(t);
    free(deep);
    jinja_free(NULL);
}

static void runtime_errors(void)
{
    char err[256];
    char *out = render("x\n{% if true %}\n{{ raise_exception('Only user and assistant roles!') }}{% endif %}", NULL,
                       NULL, err, sizeof err);
    CHECK(!out);
    CHECK_MSG(!strcmp(err, "line 3: raise_exception: Only user and assistant roles!"), "%s", err);
    out = render("{{ a.b.c }}", "{\"a\": {}}", NULL, err, sizeof err);
    CHECK_MSG(!out && strstr(err, "'b' is undefined"), "%s", out ? out : err);
    free(out);
    out = render("{{ strftime_now('%Y-%m-%d') }}", NULL, &(jinja_limits){.now = 86400 * 365}, err, sizeof err);
    CHECK_MSG(out && (!strcmp(out, "1971-01-01") || !strcmp(out, "1971-01-02") || !strcmp(out, "1970-12-31")), "%s",
              out ? out : err);
    free(out);
}

static void limits(void)
{
    char err[256];
    jinja_limits lim = {0};
    char *out = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, err, sizeof err);
    CHECK_MSG(!out && strstr(err, "too deep"), "recursion: %s", out ? "rendered" : err);
    free(out);
    lim.max_steps = 100000;
    out = render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", NULL, &lim, err,
                 sizeof err);
    CHECK_MSG(!out && strstr(err, "step limit"), "loop: %s", out ? "rendered" : err);
    free(out);
    lim.max_steps = 0;
    lim.max_output = 1000;
    out = render("{% for i in range(2000) %}x{% endfor %}", NULL, &lim, err, sizeof err);
    CHECK_MSG(!out && strstr(err, "output limit"), "output: %s", out ? "rendered" : err);
    free(out);
    out = render("{{ 'x' * 100000000000 }}", NULL, &lim, err, sizeof err);
    CHECK_MSG(!out && strstr(err, "limit"), "repeat: %s", out ? "rendered" : err);
    free(out);
    /* doubling a string in a loop hits the limits, not the memory */
    out = render("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                 NULL, NULL, err, sizeof err);
    CHECK_MSG(!out && strstr(err, "limit"), "doubling: %s", out ? "rendered" : err);
    free(out);
    lim.max_output = 1000;
    out = render("{% for i in range(999) %}x{% endfor %}", NULL, &lim, err, sizeof err);
    CHECK_MSG(out && strlen(out) == 999, "under the output limit: %s", out ? "short" : err);
    free(out);
}

int main(void)
{
    table();
    syntax_errors();
    runtime_errors();
    limits();
    return test_finish("test_jinja");
}
