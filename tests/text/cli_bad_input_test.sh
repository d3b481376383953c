#!/bin/sh
# Bad input lines get an error line naming the problem, the other lines are still processed,
# and the exit status is 1. usage: cli_bad_input_test.sh CLI TOKENIZER_JSON
set -u
cli=$1
tok=$2
fails=0
check() {  # name, expected line count, expected error count, command output
  lines=$(printf '%s\n' "$4" | grep -c .)
  errors=$(printf '%s\n' "$4" | grep -c '"error":"line [0-9]*: ')
  if [ "$lines" != "$2" ] || [ "$errors" != "$3" ]; then
    echo "FAIL $1: $lines lines, $errors errors; output:"
    printf '%s\n' "$4"
    fails=$((fails + 1))
  else
    echo "ok   $1"
  fi
}
out=$(printf '%s\n' '{"text":"Hello"}' 'not json' '{"text":5}' '[1]' '{"text":"again"}' |
      "$cli" tokenize --tokenizer "$tok")
[ $? -eq 1 ] || { echo "FAIL tokenize exit status"; fails=$((fails + 1)); }
check tokenize 5 3 "$out"
printf '%s\n' "$out" | grep -q '^{"ids":\[19923\]}$' || { echo "FAIL tokenize ids"; fails=$((fails + 1)); }
out=$(printf '%s\n' '{"ids":[19923]}' '{"ids":[999999]}' '{"ids":"x"}' '{"ids":[1.5]}' |
      "$cli" detokenize --tokenizer "$tok")
check detokenize 4 3 "$out"
printf '%s\n' "$out" | grep -q '999999 is not in the vocabulary' || { echo "FAIL detokenize message"; fails=$((fails + 1)); }
out=$(printf '%s\n' '{"messages":[{"role":"user","content":"Hi"}]}' '{"messages":[{"role":"wizard"}]}' \
      '{"messages":[],"reasoning_effort":"xhigh"}' '{}' | "$cli" render --tokenizer "$tok")
check render 4 3 "$out"
printf '%s\n' "$out" | grep -q "unknown role 'wizard'" || { echo "FAIL render message"; fails=$((fails + 1)); }
out=$(printf '%s\n' '{"ids":[19923,1]}' '{"ids":[19923],"stop":[""]}' '{"ids":[-1]}' \
      '{"ids":[19923],"finish":"later"}' | "$cli" parse --tokenizer "$tok")
check parse 4 3 "$out"
out=$("$cli" tokenize --tokenizer /nonexistent.json </dev/null 2>&1)
[ $? -ne 0 ] && printf '%s' "$out" | grep -q nonexistent.json || { echo "FAIL missing tokenizer file"; fails=$((fails + 1)); }
out=$("$cli" tokenize --bogus 2>&1 </dev/null)
[ $? -ne 0 ] && printf '%s' "$out" | grep -q "unknown argument '--bogus'" || { echo "FAIL bad flag"; fails=$((fails + 1)); }
[ $fails -eq 0 ]
