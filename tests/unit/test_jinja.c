/* Jinja interpreter: each construct on small templates, with outputs taken
 * from @huggingface/jinja 0.5.11 (the reference; tests/integration/
 * itest_jinja.c checks the real chat templates against it directly), the
 * additions the reference lacks, errors with their line and column, the
 * bounds a hostile template meets, allocation failures and leaks, and
 * concurrent renders of one parsed template. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "model/chat_tmpl.h"
#include "jinja/jinja.h"

typedef struct {
    const char *tmpl;
    const char *vars; /* JSON object, or NULL */
    const char *want;
} jcase;

/* Expected outputs below were produced by @huggingface/jinja 0.5.11. */
static const jcase k_text[] = {
    {"hello", NULL, "hello"},
    {"hello\n", NULL, "hello"},
    {"hello\n\n", NULL, "hello\n"},
    {"a\n  {% if true %}\n    b\n  {% endif %}\n c", NULL, "a\n    b\n c"},
    {"  {% if true %}x{% endif %}  {{ 'y' }}", NULL, "x  y"},
    {"a\n\t {%- if true %} b {% endif -%}\n\n c\n", NULL, "a b c"},
    {"a {{- ' b ' -}} c", NULL, "a b c"},
    {"x  {%- if true -%}  \n\n y \n {%- endif %}", NULL, "xy"},
    {"a {# comment #} b {#- c -#} c", NULL, "a  bc"},
    {"  {# c #}\nx", NULL, "x"},
    {"{% if true %}\r\n  x\r\n{% endif %}\r\n", NULL, "\r\n  x\r\n\r"},
    {"a\n{%- for i in range(3) %}\n  {{ i }}\n{%- endfor %}\nend", NULL, "a  0  1  2end"},
    {"text %}\nmore #}\nand -}\nlast", NULL, "text %}more #}and -}last"},
    {"{{ 'a' }}\n{{ 'b' }}\n", NULL, "a\nb"},
    {"  {%- if true %}x{% endif %}", NULL, "x"},
    {"pre   {%- generation -%}   abc   {%- endgeneration -%}   post", NULL, "preabcpost"},
    {"pre   {% generation %}   abc   {% endgeneration %}   post", NULL, "pre      abc      post"},
    {"{{ '{{ not a tag }}' }}{{ '{% no %}' }}", NULL, "{{ not a tag }}{% no %}"},
};

static const jcase k_literals[] = {
    {"{{ 'single' }} {{ \"double\" }} {{ 'it\\'s' }} {{ 'a' 'b' }}", NULL, "single double it's ab"},
    {"{{ '\\n\\t\\\\|\\x41\\u00e9\\ud83d\\ude00' }}", NULL, "\n\t\\|Aé😀"},
    {"{{ 42 }} {{ -7 }} {{ 1.5 }} {{ 2.0 }} {{ -0.0 }} {{ 007 }}", NULL, "42 -7 1.5 2.0 -0.0 7"},
    {"{{ true }} {{ false }} {{ True }} {{ False }} {{ none }}|{{ None }}|", NULL,
     "true false true false ||"},
    {"{{ [1, 'a', [2.0, none]] }} {{ {'k': 'v', 'n': {'m': true}} }} {{ [] }} {{ {} }}", NULL,
     "[1, \"a\", [2, null]] {\"k\": \"v\", \"n\": {\"m\": true}} [] {}"},
    {"{{ [1 2] }} {{ {'a': 1 'b': 2} }} {{ [1,] }}", NULL, "[1, 2] {\"a\": 1, \"b\": 2} [1]"},
    {"{{ (1, 2)[1] }} {{ (1, 2)|length }}", NULL, "2 2"},
};

static const jcase k_numbers[] = {
    {"{{ 1 + 2 }} {{ 7 - 10 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 "
     "% 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }}",
     NULL, "3 -3 12 3.5 2.0 3 -4 1 -1 1.5"},
    {"{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 0.5 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ (-2) ** 2 }} "
     "{{ true ** 2 }}",
     NULL, "1024 0.5 1.4142135623730951 64 4 4 1"},
    {"{{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ 10 - 2 - 3 }} {{ 2 * 3 % 4 }}", NULL,
     "5.0 9 5 2"},
    {"{{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 100000000000000000000.0 }} {{ 2 ** 70 }} {{ 2 ** -24 }} {{ "
     "0.000001 }} {{ 0.0000001 }}",
     NULL,
     "0.30000000000000004 0.3333333333333333 100000000000000000000.0 1.1805916207174113e+21 "
     "5.960464477539063e-8 0.000001 1e-7"},
    {"{{ 5 / 0 }} {{ -5 / 0 }} {{ 0 / 0 }} {{ 5 // 0 }} {{ 5 % 0 }}", NULL,
     "Infinity -Infinity NaN Infinity NaN"},
    {"{{ 1.0 ~ '' }} {{ 1.0 }} {{ [1.0] }} {{ 1.5 ~ '' }} {{ x }} {{ x ~ '' }} {{ y }}",
     "{\"x\":3.0,\"y\":9007199254740993}", "1 1.0 [1] 1.5 3 3 9007199254740992"},
    {"{{ -x }} {{ +x }} {{ - 1 }} {{ -(-1) }} {{ x-1 }} {{ x -1 }} {{ -true }}", "{\"x\":5}",
     "-5 5 -1 1 4 4 -1"},
    {"{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 1.5 >= 1 }} {{ 1 == 1.0 }} {{ 1 != 2 }}", NULL,
     "true true false true true true"},
};

static const jcase k_strings[] = {
    {"{{ 'a' ~ 1 ~ 1.5 ~ true ~ [1, 2] ~ {'a': 1} }} {{ 'a' + 1 }} {{ 1 + 'a' }} {{ 'a' + 'b' }}",
     NULL, "a11.5true1,2[object Map] a1 1a ab"},
    {"{{ s.upper() }} {{ s.lower() }} {{ s.title() }} {{ s.capitalize() }} [{{ s.strip() }}] [{{ "
     "s.lstrip() }}] [{{ s.rstrip() }}]",
     "{\"s\":\"  hELLO wORLD-x_y  \"}",
     "  HELLO WORLD-X_Y     hello world-x_y     HELLO WORLD-X_y     hELLO wORLD-x_y   [hELLO "
     "wORLD-x_y] [hELLO wORLD-x_y  ] [  hELLO wORLD-x_y]"},
    {"{{ 'xxaxx'.strip('x') }}|{{ '\\n a \\n'.lstrip('\\n') }}|{{ 'ab\\n\\n'.rstrip('\\n') }}|{{ "
     "'  y﻿'.strip() }}",
     NULL, "xxaxx|a \n|ab|y"},
    {"{{ 'a,b,,c'.split(',') }} {{ ' a  b c '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a b "
     "c'.split(none, 1) }} {{ 'a-b-c'.split('-', 0) }} {{ ''.split(',') }} {{ ''.split() }}",
     NULL,
     "[\"a\", \"b\", \"\", \"c\"] [\"a\", \"b\", \"c\"] [\"a\", \"b,c\"] [\"a\", \"b c\"] "
     "[\"a-b-c\"] [\"\"] []"},
    {"{{ 'hello'.replace('l', 'L') }} {{ 'hello'.replace('l', 'L', 1) }} {{ 'abc'.replace('', '-') "
     "}} {{ 'abc'.replace('', '.', 2) }}",
     NULL, "heLLo heLlo -a-b-c- .a.bc"},
    {"{{ 'hello'.startswith('he') }} {{ 'hello'.startswith('lo') }} {{ 'hello'.endswith(('x', "
     "'lo')) }} {{ 'abc'.startswith(['a', 1]) }}",
     NULL, "true false true true"},
    {"{{ 'abcdef'[1:3] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[-2:] }} {{ 'abcdef'[::2] }} {{ 'abc'[0] "
     "}} {{ 'abc'[-1] }} [{{ 'abc'[5] }}]",
     NULL, "bc fedcba ef ace a c []"},
    {"{{ 'é😀x'|length }} {{ 'é😀x'[::-1] }} {{ 'é😀x'[0] }} {{ 'é😀x'.length }}", NULL, "4 x😀é é 4"},
    {"{{ 'a' in 'cat' }} {{ 'x' in 'cat' }} {{ 'a' not in 'cat' }} {{ '' in 'cat' }}", NULL,
     "true false false true"},
    {"{{ m.content.split('</think>')[-1].lstrip('\\n') }}|{{ "
     "m.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
     "{\"m\":{\"content\":\"<think>\\nreasoning\\n</think>\\n\\nanswer\"}}", "answer|reasoning"},
};

static const jcase k_collections[] = {
    {"{{ m[0]['content'] }} {{ m[0].content }} {{ m[-1].role }} {{ m|length }} {{ m.length }}",
     "{\"m\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]}",
     "hi hi assistant 2 2"},
    {"{{ x[1:] }} {{ x[:-1] }} {{ x[::-2] }} {{ x[-100:100] }} {{ x[3:1] }} {{ x[3:1:-1] }} {{ "
     "x[::0] }} {{ x[5] }}|{{ x[-1] }}",
     "{\"x\":[0,1,2,3,4]}", "[1, 2, 3, 4] [0, 1, 2, 3] [4, 2, 0] [0, 1, 2, 3, 4] [] [3, 2] [] |4"},
    {"{{ d.get('a') }} {{ d.get('z', 5) }} {{ d.get('z') }} {{ d.keys() }} {{ d.values() }} {{ "
     "d.items() }} {{ d['b'] }} {{ d.zz }}|",
     "{\"d\":{\"a\":1,\"b\":[2]}}",
     "1 5  [\"a\", \"b\"] [1, [2]] [[\"a\", 1], [\"b\", [2]]] [2] |"},
    {"{{ d }}", "{\"d\":{\"b\":1,\"a\":2,\"10\":3,\"2\":4,\"01\":5,\"-1\":6}}",
     "{\"2\": 4, \"10\": 3, \"b\": 1, \"a\": 2, \"01\": 5, \"-1\": 6}"},
    {"{{ [1, 2] + [3] }} {{ 1 in [1.0] }} {{ 'a' in {'a': 1} }} {{ 'b' not in {'a': 1} }}", NULL,
     "[1, 2, 3] true true true"},
    {"{{ d.items }}", "{\"d\":{\"items\":5}}", "5"},
    {"{{ x.0 }} {{ x.1 }}", "{\"x\":[7,8]}", "7 8"},
};

static const jcase k_logic[] = {
    {"{{ a and b }}|{{ a or b }}|{{ not a }}|{{ [] or 'x' }}|{{ 0 and 1 }}|{{ none or 0 }}",
     "{\"a\":\"A\",\"b\":\"\"}", "|A|false|x|0|0"},
    {"{{ 1 if true else 2 }} {{ 1 if false else 2 }} [{{ 1 if false }}] {{ 'x' if 0 else 'y' if 1 "
     "else 'z' }}",
     NULL, "1 2 [] y"},
    {"{{ '5' == 5 }} {{ ' 5 ' == 5 }} {{ '' == 0 }} {{ 'abc' == 0 }} {{ true == 1 }} {{ true == "
     "'1' }} {{ none == undefined_x }} {{ none == 0 }}",
     NULL, "true true true false true true true false"},
    {"{{ [1] == [1] }} {{ [1, 2] == '1,2' }} {{ x == x }} {{ x == y }}", "{\"x\":[1],\"y\":[1]}",
     "false true true false"},
    {"{{ not 1 == 2 }} {{ not not 0 }} {{ 'a' in 'abc' == true }}", NULL, "true false true"},
    {"{{ 'a' in undefined_x }} {{ 'a' not in undefined_x }}", NULL, "false true"},
};

static const jcase k_control[] = {
    {"{% if x %}A{% elif y %}B{% else %}C{% endif %}{% if not x %}D{% endif %}", "{\"y\":1}", "BD"},
    {"{% for m in ms %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 "
     "}}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ m }};{% endfor %}",
     "{\"ms\":[\"a\",\"b\",\"c\"]}",
     "1/0/3/2/true/false/3/a;2/1/2/1/false/false/3/b;3/2/1/0/false/true/3/c;"},
    {"{% for x in [1, 2] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", NULL, "-2;1-;"},
    {"{% for x in [] %}a{% else %}empty{% endfor %}", NULL, "empty"},
    {"{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}",
     NULL, "2242"},
    {"{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}", NULL,
     "13"},
    {"{% for x in [1, 2, 3] %}{{ x }}{% if x == 2 %}{% break %}{% endif %}{% endfor %}", NULL, "1"},
    {"{% for x in [1, 2] %}{{ x }}{% continue %}{% else %}E{% endfor %}", NULL, "E"},
    {"{% for i in range(3) %}{% for j in range(3) %}{% if j == 1 %}{% break %}{% endif %}{{ i }}{{ "
     "j }}{% endfor %}{% endfor %}",
     NULL, "001020"},
    {"{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k in {'y': 1, "
     "'x': 2} %}{{ k }}{% endfor %}",
     NULL, "a=1;b=2;yx"},
    {"{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}", NULL, "1234"},
    {"{% for i in [1] %}{% for j in [2] %}{{ loop.index }}{{ i }}{{ j }}{% endfor %}{{ loop.length "
     "}}{% endfor %}",
     NULL, "1121"},
    {"{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", NULL,
     "241"},
    {"{% if true %}{% set z = 1 %}{% endif %}{{ z }}", NULL, "1"},
    {"{% set x %}block {{ 1 }}{% endset %}[{{ x }}]", NULL, "[block 1]"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set (c, d) = [3, 4] %}{{ c }}{{ d }}", NULL, "1234"},
    {"{% set ns = namespace(a=1, b='x') %}{% for x in [1, 2] %}{% set ns.a = ns.a + x %}{% endfor "
     "%}{{ ns.a }} {{ ns.b }} {{ ns }}",
     NULL, "4 x {\"a\": 4, \"b\": \"x\"}"},
    {"{{ namespace({'a': 2}).a }} {{ namespace([['k', 'v']]).k }}", NULL, "2 v"},
    {"{% filter upper %}hello {{ 'x' }}{% endfilter %}{% filter replace('a', 'b') %}aaa{% "
     "endfilter %}",
     NULL, "HELLO Xbbb"},
};

static const jcase k_macros[] = {
    {"{% macro m(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ m(b=5, a=4) }} "
     "{{ m() }}",
     NULL, "1-2 1-3 4-5 -2"},
    {"{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}", NULL,
     "1|[2, 3]|{\"x\": 4}"},
    {"{% macro m(a, b=a) %}{{ b }}{% endmacro %}{{ m(5) }}", NULL, "5"},
    {"{% macro m() %}[{{ caller() }}]{% endmacro %}{% call m() %}inner{% endcall %}", NULL,
     "[inner]"},
    {"{% macro m(x) %}[{{ caller(x) }}]{% endmacro %}{% call(y) m(5) %}got {{ y }}{% endcall %}",
     NULL, "[got 5]"},
    {"{% macro rec(n) %}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}",
     NULL, "543210"},
    {"{% macro m() %}{{ w }}{% endmacro %}{% for w in [1, 2] %}{{ m() }}{% endfor %}", NULL, "12"},
    {"{% macro m(a, b, c) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(*[1, 2], c=3) }}{{ m(**{'a': "
     "7, 'b': 8, 'c': 9}) }}",
     NULL, "123789"},
    {"{% macro b() %}{% break %}{% endmacro %}{% for i in range(3) %}{{ i }}{{ b() }}{% endfor %}|",
     NULL, "|"},
    {"{{ m is defined }}{% macro m() %}{% endmacro %}{{ m is defined }}{{ m is callable }}", NULL,
     "falsetruetrue"},
};

static const jcase k_filters[] = {
    {"{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) "
     "}} {{ [3, 1, 2]|sort(reverse=true) }} {{ [3, 1.5, true, 0]|sort }}",
     NULL, "[1, 2, 3] [\"A\", \"b\", \"c\"] [\"A\", \"b\", \"c\"] [3, 2, 1] [0, true, 1.5, 3]"},
    {"{{ x|sort(attribute='a.b')|map(attribute='n')|list }} {{ x|sort(attribute='a.b', "
     "reverse=true)|map(attribute='n')|list }}",
     "{\"x\":[{\"a\":{\"b\":2},\"n\":1},{\"a\":{\"b\":1},\"n\":2},{\"a\":{\"b\":2},\"n\":3}]}",
     "[2, 1, 3] [1, 3, 2]"},
    {"{{ [1, 2, 2, 1, '1', 1.0]|unique }} {{ [1, 2, 3]|reverse }} {{ [1, 2]|first }} {{ [1, "
     "2]|last }} {{ [1, 2]|length }} {{ [1, 2]|list }}",
     NULL, "[1, 2, \"1\"] [3, 2, 1] 1 2 2 [1, 2]"},
    {"{{ ['a', 'b']|join(', ') }} {{ [1, 2]|join }} {{ 'abc'|join('-') }} {{ ['a', none, 1, 1.0, "
     "true, [2, [3]]]|join(',') }}",
     NULL, "a, b 12 a-b-c a,,1,1,true,2,[3]"},
    {"{{ u|selectattr('active')|map(attribute='name')|join(',') }} {{ "
     "u|rejectattr('active')|map(attribute='name')|list }} {{ u|selectattr('role', 'equalto', "
     "'x')|list|length }} {{ u|map(attribute='role', default='?')|list }}",
     "{\"u\":[{\"name\":\"a\",\"active\":true,\"role\":\"x\"},{\"name\":\"b\",\"active\":false},{"
     "\"name\":\"c\"}]}",
     "a [\"b\", \"c\"] 1 [\"x\", \"?\", \"?\"]"},
    {"{{ 'Hello World'|lower }} {{ 'hello'|upper }} {{ \"o'neil mc-donald x_y éa\"|title }} {{ "
     "'hELLO'|capitalize }} [{{ '  a b  '|trim }}]",
     NULL, "hello world HELLO O'Neil Mc-Donald X_y éA HELLO [a b]"},
    {"{{ 'abc'|length }} {{ {'a': 1}|length }} {{ 'x'|string }} {{ 1|string }} {{ 1.0|string }} {{ "
     "true|string }} {{ [1, 'a']|string }}",
     NULL, "3 1 x 1 1.0 true [1, \"a\"]"},
    {"{{ '42'|int }} {{ '4.5'|float }} {{ 'abc'|int }} {{ 3.7|int }} {{ -3.7|int }} {{ 'x'|int(7) "
     "}} {{ true|int }} {{ '  12abc'|int }} {{ '1e3'|float }} {{ 7|int(3) }} {{ 2|float }}",
     NULL, "42 4.5 0 3 -4 7 1 12 1000.0 7 2.0"},
    {"{{ x|default('d') }} {{ y|default('d') }} {{ ''|default('d', true) }} {{ none|default('d') "
     "}} {{ 0|default('d', boolean=true) }}",
     "{\"y\":\"Y\"}", "d Y d  d"},
    {"{{ {'a': 1, 'b': 2}|items|list }} {{ {'b': 1, 'A': 3, 'a': 2}|dictsort }} {{ {'b': 1, 'a': "
     "2}|dictsort(by='value') }} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }}",
     NULL,
     "[[\"a\", 1], [\"b\", 2]] [[\"A\", 3], [\"a\", 2], [\"b\", 1]] [[\"b\", 1], [\"a\", 2]] "
     "[[\"b\", 1], [\"a\", 2]]"},
    {"{{ -5|abs }} {{ -5.5|abs }} {{ 'x'|safe }} {{ true|bool }}", NULL, "5 5.5 x true"},
    {"{{ 'abc'|indent }}|{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ "
     "'a\\n\\nb'|indent(1, true, true) }}",
     NULL, "abc|a\n  b\n\n  c|  a\n  b| a\n \n b"},
    {"{{ 'a b c'|replace(' ', '') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'aaa'|replace('a', 'b', "
     "count=1) }}",
     NULL, "abc bba baa"},
};

static const jcase k_tests[] = {
    {"{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is "
     "number }} {{ 1.5 is number }} {{ 1.5 is integer }} {{ 2 is integer }}",
     "{\"x\":1}", "true true true true true true false true"},
    {"{{ [] is iterable }} {{ 'a' is iterable }} {{ (1, 2) is iterable }} {{ (1, 2) is sequence }} "
     "{{ {} is iterable }} {{ {} is mapping }} {{ [] is mapping }} {{ [] is sequence }} {{ {} is "
     "sequence }}",
     NULL, "true true false true false true false true true"},
    {"{{ 3 is odd }} {{ 4 is even }} {{ true is boolean }} {{ 1 is boolean }} {{ false is false }} "
     "{{ 0 is false }} {{ true is true }}",
     NULL, "true true true false true false true"},
    {"{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aB' is lower }} {{ 1 is lower }} {{ range is "
     "callable }} {{ 'x' is callable }}",
     NULL, "true true false false true false"},
    {"{{ none is not none }} {{ x is not defined }} {{ x is not string }}", "{\"x\":\"s\"}",
     "false false false"},
};

static const jcase k_tojson[] = {
    {"{{ x|tojson }}|{{ x|tojson(indent=2) }}",
     "{\"x\":{\"a\":[1,2,{\"b\":\"é \\\"\\\\\\n\\t\\u0001\"}],\"c\":{},\"d\":[],\"1\":0}}",
     "{\"1\": 0, \"a\": [1, 2, {\"b\": \"é \\\"\\\\\\n\\t\\u0001\"}], \"c\": {}, \"d\": []}|{\n  "
     "\"1\": 0,\n  \"a\": [\n    1,\n    2,\n    {\n      \"b\": \"é \\\"\\\\\\n\\t\\u0001\"\n    "
     "}\n  ],\n  \"c\": {},\n  \"d\": []\n}"},
    {"{{ x|tojson(ensure_ascii=true) }} {{ x|tojson(sort_keys=true) }} {{ "
     "x|tojson(separators=(',', ':')) }}",
     "{\"x\":{\"b\":\"é😀\177\",\"a\":1,\"B\":2,\"_\":3}}",
     "{\"b\": \"\\u00e9\\ud83d\\ude00\\u007f\", \"a\": 1, \"B\": 2, \"_\": 3} {\"_\": 3, \"a\": 1, "
     "\"b\": \"é😀\177\", \"B\": 2} {\"b\":\"é😀\177\",\"a\":1,\"B\":2,\"_\":3}"},
    {"{{ [1.0, 2.5, 1e21, none, true, 'x']|tojson }} {{ [undefined_x]|tojson }} {{ [undefined_x] "
     "}} {{ undefined_x|tojson }}",
     NULL, "[1, 2.5, 1, null, null, true, \"x\"] [null] [undefined] null"},
    {"{{ {'a': [1, 2]}|tojson(separators=[', ', ' = '], indent=2) }} {{ [[]]|tojson(indent=1) }} "
     "{{ []|tojson(indent=2) }} {{ [1]|tojson(indent=0) }}",
     NULL, "{\n  \"a\" = [\n    1, \n    2\n  ]\n} [\n []\n] [] [1]"},
    {"{{ tool|tojson }}",
     "{\"tool\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
     "\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\"}},\"required\":["
     "\"location\"]}}}}",
     "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
     "{\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\"}}, \"required\": "
     "[\"location\"]}}}"},
};

static const jcase k_undefined[] = {
    {"[{{ x }}] [{{ x.y.z }}] [{{ none.x }}] [{{ 5.x }}] [{{ x['y'] }}]", NULL, "[] [] [] [] []"},
    {"{{ x is defined }} {{ x.y is defined }} {{ d.missing is defined }} {{ d.a is defined }}",
     "{\"d\":{\"a\":null}}", "false false false true"},
    {"{% set f = [] | first %}{{ f is defined }}", NULL, "false"},
};

static const jcase k_globals[] = {
    {"{{ range(3) }} {{ range(1, 4) }} {{ range(5, 0, -2) }} {{ range(0) }} {{ range(0, 1, 0.25) "
     "}} {{ range('3') }}",
     NULL, "[0, 1, 2] [1, 2, 3] [5, 3, 1] [] [0, 0.25, 0.5, 0.75] [0, 1, 2]"},
    {"{{ strftime_now('%%|%Y')|length }} {{ strftime_now('x %q y') }}", NULL, "6 x %q y"},
    {"{{ raise_exception is callable }} {{ namespace is callable }}", NULL, "true true"},
};

static json_t *load_vars(const char *vars)
{
    if (!vars) return NULL;
    json_error_t e;
    json_t *j = json_loads(vars, JSON_ALLOW_NUL, &e);
    if (!j) fail_msg("bad vars %s: %s", vars, e.text);
    return j;
}

/* Renders tmpl with vars under lim; the code, and the text in *out. */
static int render_lim(const char *tmpl, const char *vars, const jinja_limits *lim, char **out)
{
    jinja_tmpl *t;
    *out = NULL;
    int rc = jinja_parse(tmpl, strlen(tmpl), &t);
    if (rc) return rc;
    json_t *v = load_vars(vars);
    dx_buf b;
    dx_buf_init(&b, 0);
    rc = jinja_render_ex(t, v, lim, &b);
    if (!rc) *out = dx_buf_take(&b);
    dx_buf_free(&b);
    json_decref(v);
    jinja_free(t);
    return rc;
}

static char *render_ok(const char *tmpl, const char *vars)
{
    char *s;
    if (render_lim(tmpl, vars, NULL, &s)) fail_msg("%s\n  failed: %s", tmpl, dx_errmsg());
    return s ? s : dx_strdup("");
}

static void run_cases(const jcase *c, size_t n)
{
    size_t live = dx_alloc_live_count();
    for (size_t i = 0; i < n; i++) {
        char *got = render_ok(c[i].tmpl, c[i].vars);
        if (strcmp(got, c[i].want))
            fail_msg("template: %s\n  want: [%s]\n  got:  [%s]", c[i].tmpl, c[i].want, got);
        dx_free(got);
    }
    assert_int_equal(dx_alloc_live_count(), live); /* nothing leaks */
}

#define CASES(name)                                                                                \
    static void test_##name(void **state)                                                          \
    {                                                                                              \
        (void)state;                                                                               \
        run_cases(k_##name, DX_ARRAY_LEN(k_##name));                                               \
    }

CASES(text)
CASES(literals)
CASES(numbers)
CASES(strings)
CASES(collections)
CASES(logic)
CASES(control)
CASES(macros)
CASES(filters)
CASES(tests)
CASES(tojson)
CASES(undefined)
CASES(globals)

/* What Python Jinja has and the reference lacks (Python's results). */
static const jcase k_additions[] = {
    {"{{ 3.14159|round(2) }} {{ 2.675|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 5|round }}",
     NULL, "3.14 2.67 2.0 4.0 5"},
    {"{{ 1.5|round(0, 'floor') }} {{ 1.2|round(method='ceil') }} {{ 1.25|round(1, 'floor') }}",
     NULL, "1.0 2.0 1.2"},
    {"{{ [1, 2]|count }} {{ 'abc'|count }} {{ {'a': 1}|count }}", NULL, "2 3 1"},
    {"{{ 'abcé😀c'.find('c') }} {{ 'é😀c'.find('c') }} {{ 'abc'.find('z') }}", NULL, "2 2 -1"},
};
CASES(additions)

static void test_synthetic_chat_templates(void **state)
{
    (void)state;
    const char *vars = "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"},"
                       "{\"role\": \"user\", \"content\": \"Hi\"},"
                       "{\"role\": \"tool\", \"content\": \"{}\"}],"
                       "\"add_generation_prompt\": true, \"bos_token\": \"<|begin_of_text|>\"}";
    char *s = render_ok(chat_tmpl_jinja(CHAT_TMPL_CHATML), vars);
    assert_string_equal(s, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                           "<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n"
                           "<|im_start|>assistant\n");
    dx_free(s);
    s = render_ok(chat_tmpl_jinja(CHAT_TMPL_LLAMA3), vars);
    assert_string_equal(s, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS"
                           "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                           "<|start_header_id|>ipython<|end_header_id|>\n\n{}<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    dx_free(s);
}

typedef struct {
    const char *tmpl;
    const char *vars;
    int code;
    const char *msg; /* a part of the message */
} jerr;

static const jerr k_errors[] = {
    /* parsing: the line and column of the token where it stopped */
    {"{% if x %}\n  {{ 1 + }}\n{% endif %}", NULL, DX_EINVAL,
     "line 2, column 10: expected an expression, found '}}'"},
    {"{% for x in y %}\n{% endif %}", NULL, DX_EINVAL,
     "line 2, column 4: unknown statement 'endif'"},
    {"{% if x %}\nabc", NULL, DX_EINVAL,
     "line 2, column 4: unexpected end of the template: "
     "missing '{% endif %}'"},
    {"line one\n{{ 'abc }}", NULL, DX_EINVAL, "line 2, column 4: unterminated string"},
    {"{{ x", NULL, DX_EINVAL, "line 1, column 5: unexpected end of template"},
    {"{# unclosed", NULL, DX_EINVAL, "line 1, column 1: missing end of comment tag"},
    {"{% raw %}x{% endraw %}", NULL, DX_EINVAL, "unknown statement 'raw'"},
    {"ok\n  {{ x.'a' }}", NULL, DX_EINVAL, "line 2, column 12: expected a name or an integer"},
    {"{{ 'a\\q' }}", NULL, DX_EINVAL, "line 1, column 6: unexpected escaped character 'q'"},
    {"{{ '\\ud800' }}", NULL, DX_EINVAL, "lone surrogate"},
    {"{% macro m(a, a) %}{% endmacro %}", NULL, DX_EINVAL, "duplicate parameter 'a'"},
    {"{{ f(a=1, 2) }}", NULL, DX_EINVAL, "positional arguments must come before keyword"},
    {"{{ x[1:2:3:4] }}", NULL, DX_EINVAL, "at most three parts"},
    {"{{ 1 ! 2 }}", NULL, DX_EINVAL, "line 1, column 6: unexpected character '!'"},
    {"{% set x = %}", NULL, DX_EINVAL, "line 1, column 12: expected an expression, found '%}'"},
    {"{% for x.y in z %}{% endfor %}", NULL, DX_EINVAL, "expected 'in' after the loop variable"},
    {"{{ 1 }}\n\t\xC3\x28", NULL, DX_EINVAL, "line 2, column 2: the template is not valid UTF-8"},
    /* running: the line and column of the expression */
    {"a\n{%- if messages[0]['role'] != 'user' %}\n"
     "    {{- raise_exception('Conversation must start with a user message') }}\n{%- endif %}",
     "{\"messages\": [{\"role\": \"system\"}]}", DX_EINVAL,
     "line 3, column 9: raise_exception: Conversation must start with a user message"},
    {"{{ x + 1 }}", NULL, DX_EINVAL, "line 1, column 6: cannot apply '+' to an undefined value"},
    {"{{ 'a' ~ none }}", NULL, DX_EINVAL, "cannot apply '~' to none"},
    {"{{\n  messages|foo }}", "{\"messages\": []}", DX_EINVAL,
     "line 2, column 12: filter 'foo' cannot be applied to list"},
    {"{% break %}", NULL, DX_EINVAL, "'break' outside a loop"},
    {"{{ [] | first }}", NULL, DX_EINVAL, "value is undefined (the first or last item"},
    {"{{ x|length }}", "{\"x\": null}", DX_EINVAL, "filter 'length' cannot be applied to none"},
    {"{{ 1 is nope }}", NULL, DX_EINVAL, "unknown test 'nope'"},
    {"{{ 1 is equalto }}", NULL, DX_EINVAL, "needs a value to compare with"},
    {"{{ 1 < 2 < 3 }}", NULL, DX_EINVAL, "operator '<' is not defined between boolean and integer"},
    {"{{ x() }}", NULL, DX_EINVAL, "'x' is not a function (it is undefined)"},
    {"{{ 'a'.nope() }}", NULL, DX_EINVAL, "'nope' is not a function"},
    {"{{ range }}", NULL, DX_EINVAL, "cannot convert a function to text"},
    {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, DX_EINVAL,
     "macro 'm' takes not more than 1 argument(s)"},
    {"{% macro m(a) %}{% endmacro %}{{ m(b=2) }}", NULL, DX_EINVAL,
     "macro 'm' takes no keyword argument 'b'"},
    {"{% for a, b in [1] %}{% endfor %}", NULL, DX_EINVAL, "cannot unpack integer"},
    {"{% for a in 'abc' %}{% endfor %}", NULL, DX_EINVAL, "cannot iterate over string"},
    {"{% set d = {} %}{% set d.x = 1 %}", NULL, DX_EINVAL, "only of a namespace()"},
    {"{{ (1, 2)|tojson }}", NULL, DX_EINVAL, "cannot convert a tuple to JSON"},
    {"{{ range(0, 3, 0) }}", NULL, DX_EINVAL, "step must not be zero"},
    {"{{ 'x'.split('') }}", NULL, DX_EINVAL, "empty separator"},
    {"{{ {1: 2} }}", NULL, DX_EINVAL, "dict keys must be strings"},
    {"{{ 0 ** -1 }}", NULL, DX_EINVAL, "cannot be raised to a negative power"},
    {"{{ none|string }}", NULL, DX_EINVAL, "filter 'string' cannot be applied to none"},
    {"{{ [1, 'a']|sort }}", NULL, DX_EINVAL, "cannot compare string with integer"},
    /* variables that would shadow a built-in, as in the reference */
    {"x", "{\"range\": 1}", DX_EINVAL, "variable 'range' is a built-in name"},
    {"x", "[1]", DX_EINVAL, "the variables must be a JSON object"},
};

static void test_errors(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_count();
    for (size_t i = 0; i < DX_ARRAY_LEN(k_errors); i++) {
        const jerr *e = &k_errors[i];
        char *out;
        int rc = render_lim(e->tmpl, e->vars, NULL, &out);
        if (rc != e->code || !strstr(dx_errmsg(), e->msg))
            fail_msg("template: %s\n  want %d '%s'\n  got  %d '%s'", e->tmpl, e->code, e->msg, rc,
                     dx_errmsg());
        assert_null(out);
    }
    assert_int_equal(dx_alloc_live_count(), live);
}

/* Messages name long identifiers in full, and one too long for the error
 * buffer keeps its place ("jinja: line L, column C: ") and loses its end. */
static void test_long_messages(void **state)
{
    (void)state;
    enum { N = 900 };
    char name[N + 1], tmpl[2 * N + 64], want[N + 128];
    memset(name, 'c', N);
    name[N] = 0;
    /* parsing */
    snprintf(tmpl, sizeof tmpl, "{%% macro m(%s, %s) %%}{%% endmacro %%}", name, name);
    jinja_tmpl *t;
    assert_int_equal(jinja_parse(tmpl, strlen(tmpl), &t), DX_EINVAL);
    snprintf(want, sizeof want, "jinja: line 1, column %d: duplicate parameter '%s'", 2 * N + 14,
             name); /* at the ")" */
    assert_string_equal(dx_errmsg(), want);
    /* running */
    char *out;
    snprintf(tmpl, sizeof tmpl, "{{ 1 | %s }}", name);
    assert_int_equal(render_lim(tmpl, NULL, NULL, &out), DX_EINVAL);
    snprintf(want, sizeof want, "jinja: line 1, column 8: filter '%s' cannot be applied to integer",
             name);
    assert_string_equal(dx_errmsg(), want);
    /* past what the error buffer holds */
    char big[2 * N + 1];
    memset(big, 'a', 2 * N);
    big[2 * N] = 0;
    snprintf(tmpl, sizeof tmpl, "{{ 1 | %s }}", big);
    assert_int_equal(render_lim(tmpl, NULL, NULL, &out), DX_EINVAL);
    const char *msg = dx_errmsg(), *lead = "jinja: line 1, column 8: filter 'aaa";
    assert_memory_equal(msg, lead, strlen(lead));
    assert_true(strlen(msg) > N && strlen(msg) < 2 * N);
    assert_int_equal(strspn(msg + strlen(lead), "a"), strlen(msg) - strlen(lead));
}

/* The bounds a template from a model file meets: each one ends the render
 * with DX_ETOOBIG and a message, quickly. */
static void expect_limit(const char *tmpl, const char *vars, const jinja_limits *lim,
                         const char *msg)
{
    char *out;
    int rc = render_lim(tmpl, vars, lim, &out);
    if (rc != DX_ETOOBIG || !strstr(dx_errmsg(), msg))
        fail_msg("template: %s\n  want DX_ETOOBIG '%s'\n  got %d '%s'", tmpl, msg, rc, dx_errmsg());
}

static void test_limits(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_count();
    jinja_limits steps = {.max_steps = 100000};
    expect_limit("{% for i in range(1000000) %}{% endfor %}", NULL, &steps,
                 "more than 100000 steps");
    expect_limit("{% for i in range(1000) %}{% for j in range(1000) %}{{ i }}{% endfor %}"
                 "{% endfor %}",
                 NULL, &steps, "steps");
    expect_limit("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", NULL, NULL,
                 "nests deeper than 400 levels");
    jinja_limits out = {.max_output = 1 << 20};
    expect_limit(
        "{% set s = 'xxxxxxxxxx' %}{% for i in range(30) %}{% set s = s ~ s %}{% endfor %}", NULL,
        &out, "longer than the limit");
    expect_limit("{% for i in range(200000) %}xxxxxxxxxx{% endfor %}", NULL, &out,
                 "output longer than the limit of 1048576 bytes");
    jinja_limits mem = {.max_memory = 100 << 10};
    expect_limit("{% for i in range(10000) %}{% set x = [i, i, i] %}{% endfor %}", NULL, &mem,
                 "more than 102400 bytes of memory");
    expect_limit("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns }}", NULL, NULL,
                 "does it contain itself?");
    /* nesting in the source is bounded at parse time */
    char deep[1024];
    strcpy(deep, "{{ ");
    for (int i = 0; i < 300; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 300; i++) strcat(deep, ")");
    strcat(deep, " }}");
    expect_limit(deep, NULL, NULL, "nested deeper than 200 levels");
    /* deeply nested variables */
    char vars[4096];
    strcpy(vars, "{\"x\": ");
    for (int i = 0; i < 500; i++) strcat(vars, "[");
    for (int i = 0; i < 500; i++) strcat(vars, "]");
    strcat(vars, "}");
    expect_limit("{{ x }}", vars, NULL, "nested deeper than 400 levels");
    /* and the size of the source */
    size_t n = JINJA_MAX_SOURCE + 1;
    char *big = dx_malloc(n);
    memset(big, 'x', n);
    jinja_tmpl *t;
    assert_int_equal(jinja_parse(big, n, &t), DX_ETOOBIG);
    assert_null(t);
    dx_free(big);
    assert_int_equal(dx_alloc_live_count(), live);
}

static void test_api(void **state)
{
    (void)state;
    jinja_free(NULL);
    jinja_tmpl *t;
    const char *src = "{{ greeting }}, {{ name|default('you') }}!";
    assert_int_equal(jinja_parse(src, strlen(src), &t), 0);
    /* output is appended; NULL variables are all undefined */
    dx_buf b;
    dx_buf_init(&b, 0);
    dx_buf_puts(&b, "> ");
    assert_int_equal(jinja_render(t, NULL, &b), 0);
    assert_string_equal(b.data, "> , you!");
    /* an error leaves the output as it was */
    json_t *bad = json_pack("{s:s}", "true", "x");
    assert_int_equal(jinja_render(t, bad, &b), DX_EINVAL);
    assert_string_equal(b.data, "> , you!");
    json_decref(bad);
    /* the source need not be NUL-terminated */
    jinja_tmpl *t2;
    assert_int_equal(jinja_parse("{{ 1 }}XXXX", 7, &t2), 0);
    dx_buf_reset(&b);
    assert_int_equal(jinja_render(t2, NULL, &b), 0);
    assert_string_equal(b.data, "1");
    jinja_free(t2);
    dx_buf_free(&b);
    jinja_free(t);
}

/* A chat-template-sized workload for the allocation and thread tests. */
static const char k_chat[] =
    "{%- set ns = namespace(last=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}<|{{ m.role }}|>{{ m.content|trim }}"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}\n{{ c.function|tojson }}{%- endfor %}"
    "{%- endif %}{%- if loop.index0 > ns.last %}*{%- endif %}\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{%- endif %}";
static const char k_chat_vars[] =
    "{\"messages\": [{\"role\": \"user\", \"content\": \" Hi \"},"
    "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\": "
    "{\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, \"é\"]}}}]},"
    "{\"role\": \"tool\", \"content\": \"42\"}], \"add_generation_prompt\": true}";
static const char k_chat_want[] =
    "<|user|>Hi<|assistant|>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, \"é\"]}}*"
    "<|tool|>42*<|assistant|>";

/* Every allocation, failing in turn: an error or the right text, never a
 * crash or a leak. */
static void test_allocation_failures(void **state)
{
    (void)state;
    json_t *v = load_vars(k_chat_vars);
    size_t live = dx_alloc_live_count();
    int failures = 0;
    for (long n = 1; n < 400; n++) {
        jinja_tmpl *t = NULL;
        dx_buf b;
        dx_buf_init(&b, 0);
        dx_alloc_fail_after(n, 0);
        int rc = jinja_parse(k_chat, strlen(k_chat), &t);
        if (!rc) rc = jinja_render(t, v, &b);
        dx_alloc_fail_after(0, 0);
        if (rc) {
            assert_int_equal(rc, DX_ENOMEM);
            failures++;
        } else {
            assert_string_equal(b.data, k_chat_want);
        }
        jinja_free(t);
        dx_buf_free(&b);
        assert_int_equal(dx_alloc_live_count(), live);
    }
    assert_true(failures > 10);
    json_decref(v);
}

/* A dict past JO_LINEAR keys (a big tool schema from a client) is looked up
 * through its hash index: lookups, copies into a namespace, keyword
 * arguments, and the deletion of a macro's named parameter from **d.
 * Outputs from the reference. */
static void test_big_dict(void **state)
{
    (void)state;
    json_t *d = json_object();
    for (int i = 0; i < 5000; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        json_object_set_new(d, k, json_integer(i));
    }
    json_t *vars = json_pack("{s:o}", "d", d);
    static const char *const tmpl[][2] = {
        {"{% set ns = namespace(d) %}{% set acc = namespace(s=0) %}{% for k in d %}"
         "{% set acc.s = acc.s + d[k] + ns[k] %}{% endfor %}{{ acc.s }} {{ d.get('k4321') }} "
         "{{ d|length }} {{ 'k77' in d }} {{ 'zz' in d }}",
         "24995000 4321 5000 true false"},
        {"{% macro m(k17) %}{{ k17 }} {{ kwargs|length }} {{ kwargs.k4999 }} "
         "{{ kwargs.k17 is defined }}{% endmacro %}{{ m(**d) }}",
         "17 4999 4999 false"},
        {"{{ d|tojson|length }} {{ (d|dictsort)[-1] }} {{ d.items()|list|length }}",
         "72780 [\"k999\", 999] 5000"},
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(tmpl); i++) {
        jinja_tmpl *t;
        dx_buf b;
        dx_buf_init(&b, 0);
        assert_int_equal(jinja_parse(tmpl[i][0], strlen(tmpl[i][0]), &t), 0);
        if (jinja_render(t, vars, &b)) fail_msg("%s", dx_errmsg());
        assert_string_equal(b.data, tmpl[i][1]);
        dx_buf_free(&b);
        jinja_free(t);
    }
    json_decref(vars);
}

typedef struct {
    const jinja_tmpl *t;
    json_t *vars;
    int ok;
} thread_arg;

static void *render_thread(void *p)
{
    thread_arg *a = p;
    a->ok = 1;
    for (int i = 0; i < 200; i++) {
        dx_buf b;
        dx_buf_init(&b, 0);
        if (jinja_render(a->t, a->vars, &b) || strcmp(b.data, k_chat_want)) a->ok = 0;
        dx_buf_free(&b);
    }
    return NULL;
}

/* A parsed template is immutable: threads render it at once. */
static void test_concurrent_renders(void **state)
{
    (void)state;
    jinja_tmpl *t;
    assert_int_equal(jinja_parse(k_chat, strlen(k_chat), &t), 0);
    json_t *v = load_vars(k_chat_vars);
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){t, v, 0};
        assert_int_equal(pthread_create(&th[i], NULL, render_thread, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
    json_decref(v);
    jinja_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_literals),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_collections),
        cmocka_unit_test(test_logic),
        cmocka_unit_test(test_control),
        cmocka_unit_test(test_macros),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_tests),
        cmocka_unit_test(test_tojson),
        cmocka_unit_test(test_undefined),
        cmocka_unit_test(test_globals),
        cmocka_unit_test(test_additions),
        cmocka_unit_test(test_synthetic_chat_templates),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_long_messages),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_api),
        cmocka_unit_test(test_big_dict),
        cmocka_unit_test(test_allocation_failures),
        cmocka_unit_test(test_concurrent_renders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
