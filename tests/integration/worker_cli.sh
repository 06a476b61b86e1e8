#!/bin/sh
# traind-worker's command line: exit codes and the messages a user sees.
#   worker_cli.sh WORKER SOURCE_DIR
set -u
worker=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
passes=0

expect() { # description expected_status expected_stderr_fragment -- command...
    desc=$1 status=$2 fragment=$3
    shift 4
    "$@" >"$tmp/out" 2>"$tmp/err"
    got=$?
    if [ "$got" -ne "$status" ]; then
        echo "FAIL: $desc: exit status $got, expected $status"; cat "$tmp/err"
        fails=$((fails + 1))
    elif [ -n "$fragment" ] && ! grep -qF -- "$fragment" "$tmp/err" "$tmp/out"; then
        echo "FAIL: $desc: output lacks: $fragment"; cat "$tmp/err"
        fails=$((fails + 1))
    else
        passes=$((passes + 1))
    fi
}

expect "help" 0 "usage: traind-worker" -- "$worker" --help
expect "no arguments" 2 "usage: traind-worker" -- "$worker"
expect "unknown option" 2 "unknown option --fast" -- "$worker" --fast x.json
expect "missing spec file" 1 "$tmp/none.json" -- "$worker" "$tmp/none.json"
printf '{"model": {"preset": "lenet5", "num_classes": 10},\n "data": [}' >"$tmp/bad.json"
expect "JSON syntax error with line" 1 "bad.json:2:" -- "$worker" "$tmp/bad.json"
expect "example spec is valid" 0 "valid" -- "$worker" --check "$src/examples/fmnist-lenet.json"
sed 's/"lenet5"/"lenet6"/' "$src/examples/fmnist-lenet.json" >"$tmp/preset.json"
expect "unknown preset" 1 'model.preset: expected one of lenet5/mlp/cifar_net/resnet18/resnet34/resnet50/gpt/gpt2/gpt2-medium, found "lenet6"' -- \
    "$worker" "$tmp/preset.json"
sed 's|train-images-idx3-ubyte.gz|train-labels-idx1-ubyte.gz|' "$src/examples/fmnist-lenet.json" \
    >"$tmp/magic.json"
expect "labels file given as images" 1 "magic number is 0x00000801, expected 0x00000803" -- \
    "$worker" "$tmp/magic.json"

expect "stop-after needs a number" 2 "--stop-after needs a step count" -- \
    "$worker" --stop-after zero "$src/examples/fmnist-lenet.json"
expect "stop-after needs checkpoint.dir" 2 "--stop-after needs checkpoint.dir" -- \
    "$worker" --stop-after 5 "$src/examples/fmnist-lenet.json"
expect "eval needs weights" 1 "--eval: give resume_from or model.init_from" -- \
    "$worker" --eval "$src/examples/fmnist-lenet.json"
sed 's|"log"|"resume_from": "/nonexistent/ck", "log"|' "$src/examples/fmnist-lenet.json" \
    >"$tmp/resume.json"
expect "resume from a missing checkpoint" 1 "/nonexistent/ck is not a checkpoint directory" -- \
    "$worker" "$tmp/resume.json"

# train a few steps with a checkpoint, then evaluate it with --eval
cat >"$tmp/small.json" <<JSON
{"model": {"preset": "mlp", "hidden": [16], "num_classes": 10},
 "data": {"format": "synthetic", "shape": [1, 8, 8], "num_classes": 10, "size": 64, "val_size": 32},
 "train": {"max_steps": 4, "batch_size": 16, "optimizer": {"type": "sgd", "lr": 0.1}},
 "checkpoint": {"dir": "$tmp/ck"}}
JSON
expect "short training run with a checkpoint" 0 '"event":"checkpoint","step":4' -- \
    "$worker" "$tmp/small.json"
sed 's|"checkpoint"|"resume_from": "latest", "checkpoint"|' "$tmp/small.json" >"$tmp/eval.json"
expect "evaluate the latest checkpoint" 0 '{"event":"eval","epoch":1,"step":4,' -- \
    "$worker" --eval "$tmp/eval.json"

# sample: text from a checkpoint of a run on text, and what it says when it cannot
expect "sample needs a checkpoint" 2 "usage: traind-worker" -- "$worker" sample
expect "sample's numbers are checked" 2 "--tokens 0: not a number in its range" -- \
    "$worker" sample "$tmp/ck" --tokens 0
expect "sample's options are known" 2 "unknown option --length" -- \
    "$worker" sample "$tmp/ck" --length 5
expect "sample of a missing checkpoint" 1 "/nonexistent/ck: no such checkpoint" -- \
    "$worker" sample /nonexistent/ck
expect "sample of a model not trained on text" 1 "the model was not trained on text" -- \
    "$worker" sample "$tmp/ck/step-00000004"
head -c 3000 "$src/examples/data/tinyshakespeare.txt" >"$tmp/play.txt"
cat >"$tmp/gpt.json" <<JSON
{"model": {"preset": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
 "data": {"format": "text", "train": {"path": "$tmp/play.txt"}, "block_size": 16},
 "train": {"max_steps": 2, "batch_size": 4, "optimizer": {"type": "adamw", "lr": 0.01}},
 "checkpoint": {"dir": "$tmp/gpt-ck"}}
JSON
expect "a GPT on text with a checkpoint" 0 '"event":"checkpoint","step":2' -- \
    "$worker" "$tmp/gpt.json"
expect "sample from its checkpoint" 0 "First Citizen:" -- \
    "$worker" sample "$tmp/gpt-ck/step-00000002" --prompt "First Citizen:" --tokens 20
expect "a prompt outside the vocabulary" 1 "--prompt: character U+0040 is not in the vocabulary" -- \
    "$worker" sample "$tmp/gpt-ck/step-00000002" --prompt "@"

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
