"""Regenerate the bundled prompt sets in playbooks/prompts/ (deterministic; committed output).

coding.jsonl: coding and agentic prompts of varied length (completion, refactoring, bug
fixing, tests, review, tool-use instructions), the kind of traffic EAGLE-3 drafters are
trained on. chat.jsonl: everyday assistant questions. Run: python scripts/make_prompt_sets.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "playbooks" / "prompts"

SNIPPETS = {
    "python-lru": ("Python", '''class LRUCache:
    def __init__(self, capacity):
        self.capacity = capacity
        self.items = {}
        self.order = []

    def get(self, key):
        if key not in self.items:
            return None
        self.order.remove(key)
        self.order.append(key)
        return self.items[key]

    def put(self, key, value):
        if key in self.items:
            self.order.remove(key)
        elif len(self.items) >= self.capacity:
            oldest = self.order.pop(0)
            del self.items[oldest]
        self.items[key] = value
        self.order.append(key)'''),
    "python-retry": ("Python", '''import time

def fetch_with_retry(client, url, attempts=3):
    for i in range(attempts):
        try:
            return client.get(url, timeout=5)
        except Exception:
            time.sleep(2 ** i)
    return None'''),
    "python-parse": ("Python", '''def parse_config(lines):
    config = {}
    for line in lines:
        if line.startswith("#"):
            continue
        key, value = line.split("=")
        config[key.strip()] = value.strip()
    return config'''),
    "python-async": ("Python", '''import asyncio

async def gather_pages(session, urls):
    results = []
    for url in urls:
        async with session.get(url) as resp:
            results.append(await resp.text())
    return results'''),
    "python-pandas": ("Python", '''import pandas as pd

def monthly_revenue(df):
    df["month"] = df["date"].str[:7]
    out = df.groupby("month").sum()
    return out["amount"].sort_index()'''),
    "js-debounce": ("JavaScript", '''function debounce(fn, wait) {
  let timer;
  return function (...args) {
    clearTimeout(timer);
    timer = setTimeout(() => fn(args), wait);
  };
}'''),
    "js-fetch": ("JavaScript", '''async function loadUsers(api) {
  const res = await fetch(api + "/users");
  const data = res.json();
  return data.users.filter(u => u.active).map(u => u.name);
}'''),
    "ts-reducer": ("TypeScript", '''type Action = { type: "add"; item: string } | { type: "remove"; index: number };

function reducer(state: string[], action: Action): string[] {
  switch (action.type) {
    case "add":
      state.push(action.item);
      return state;
    case "remove":
      return state.filter((_, i) => i !== action.index);
  }
}'''),
    "go-worker": ("Go", '''func process(jobs []Job) []Result {
	results := []Result{}
	var wg sync.WaitGroup
	for _, job := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results = append(results, run(job))
		}()
	}
	wg.Wait()
	return results
}'''),
    "go-http": ("Go", '''func handler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req Request
	json.Unmarshal(body, &req)
	resp := compute(req)
	w.Write([]byte(fmt.Sprintf("%v", resp)))
}'''),
    "rust-parse": ("Rust", '''fn parse_pairs(input: &str) -> Vec<(String, i64)> {
    input
        .lines()
        .map(|line| {
            let mut parts = line.split(':');
            let key = parts.next().unwrap().to_string();
            let value = parts.next().unwrap().trim().parse().unwrap();
            (key, value)
        })
        .collect()
}'''),
    "rust-cache": ("Rust", '''struct Cache {
    map: HashMap<String, Vec<u8>>,
}

impl Cache {
    fn get_or_load(&mut self, key: &str) -> &Vec<u8> {
        if !self.map.contains_key(key) {
            let data = std::fs::read(key).unwrap();
            self.map.insert(key.to_string(), data);
        }
        self.map.get(key).unwrap()
    }
}'''),
    "sql-report": ("SQL", '''SELECT c.name, SUM(o.total) AS revenue
FROM customers c
JOIN orders o ON o.customer_id = c.id
WHERE o.created_at > '2024-01-01'
GROUP BY c.name
ORDER BY revenue DESC;'''),
    "bash-deploy": ("Bash", '''#!/bin/bash
for host in $(cat hosts.txt); do
  scp build.tar.gz root@$host:/tmp/
  ssh root@$host "cd /opt/app && tar xzf /tmp/build.tar.gz && systemctl restart app"
done'''),
    "java-stream": ("Java", '''public Map<String, Long> countWords(List<String> lines) {
    Map<String, Long> counts = new HashMap<>();
    for (String line : lines) {
        for (String w : line.split(" ")) {
            counts.put(w, counts.get(w) + 1);
        }
    }
    return counts;
}'''),
    "cpp-vector": ("C++", '''std::vector<int> topK(std::vector<int>& v, int k) {
    std::sort(v.begin(), v.end());
    std::vector<int> out;
    for (int i = v.size() - 1; i > v.size() - k; i--) {
        out.push_back(v[i]);
    }
    return out;
}'''),
    "python-flask": ("Python", '''from flask import Flask, request
import sqlite3

app = Flask(__name__)

@app.route("/user")
def user():
    name = request.args.get("name")
    db = sqlite3.connect("app.db")
    row = db.execute(f"SELECT * FROM users WHERE name = '{name}'").fetchone()
    return {"user": row}'''),
    "python-torch": ("Python", '''import torch

def train_step(model, batch, optimizer):
    inputs, labels = batch
    outputs = model(inputs)
    loss = torch.nn.functional.cross_entropy(outputs, labels)
    loss.backward()
    optimizer.step()
    return loss.item()'''),
    "yaml-k8s": ("YAML", '''apiVersion: apps/v1
kind: Deployment
metadata:
  name: inference
spec:
  replicas: 2
  template:
    spec:
      containers:
        - name: server
          image: registry.example/inference:latest
          resources:
            limits:
              nvidia.com/gpu: 8'''),
    "python-cli": ("Python", '''import argparse, json

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--input")
    p.add_argument("--limit", default=10)
    args = p.parse_args()
    data = json.load(open(args.input))
    for item in data[:args.limit]:
        print(item["name"], item["score"])'''),
}

TASKS = [
    ("completion", "Complete the following {lang} code so that it handles every edge case, and "
     "add type annotations where the language allows:\n\n```\n{code}\n```"),
    ("refactor", "Refactor this {lang} code for readability and performance without changing "
     "its behaviour. Explain each change in one sentence.\n\n```\n{code}\n```"),
    ("bugfix", "This {lang} code has at least one bug. Find it, explain why it happens, and "
     "give a corrected version.\n\n```\n{code}\n```"),
    ("tests", "Write thorough unit tests for this {lang} code, covering normal inputs, edge "
     "cases and failure modes. Use the standard test framework for the language.\n\n```\n{code}\n```"),
    ("review", "Review this {lang} code as a senior engineer would in a pull request: "
     "correctness, security, concurrency, naming, and what you would ask the author.\n\n```\n{code}\n```"),
    ("explain", "Explain step by step what this {lang} code does, its time and memory "
     "complexity, and when it would fail.\n\n```\n{code}\n```"),
    ("port", "Port this {lang} code to {other}, keeping the same behaviour and idioms of the "
     "target language.\n\n```\n{code}\n```"),
    ("tool-use", "You are a coding agent with the tools read_file(path), write_file(path, "
     "content), run(cmd) and search(query). The repository contains the {lang} code below in "
     "{path}. Plan the tool calls needed to {goal}, then emit them as JSON objects, one per "
     "line, with keys tool and args.\n\n```\n{code}\n```"),
    ("agent-plan", "You are an autonomous software agent. Goal: {goal}. Context: the file "
     "{path} currently contains:\n\n```\n{code}\n```\n\nThink through the steps, list the "
     "commands you would run, the files you would change, and how you would verify the result."),
    ("docstring", "Add complete docstrings and inline comments to this {lang} code, in the "
     "style of a well-maintained open-source project.\n\n```\n{code}\n```"),
    ("optimize", "This {lang} code is on a hot path serving thousands of requests per second. "
     "Profile it mentally, identify the bottlenecks, and rewrite it for speed.\n\n```\n{code}\n```"),
    ("security", "Audit this {lang} code for security vulnerabilities (injection, unsafe "
     "deserialization, race conditions, resource exhaustion) and patch each one.\n\n```\n{code}\n```"),
]
OTHERS = ["Rust", "Go", "TypeScript", "Python", "Java", "C++"]
GOALS = [
    "add structured logging and make every error path observable",
    "make the code safe to call from several threads at once",
    "add a command-line flag that changes the behaviour and document it",
    "fix the failing test test_edge_cases and keep the others green",
    "add retries with exponential backoff and a total timeout",
    "split the code into a module with a clean public API",
]
EXTRA = [
    "",
    "\n\nConstraints: keep the public interface unchanged, avoid new dependencies, and keep "
    "the answer under 80 lines of code.",
    "\n\nContext: this runs in a production service owned by a small team. They care about "
    "clear error messages, predictable latency and code that a new hire can read in one "
    "sitting. Previous incidents were caused by silent failures and unbounded retries, so "
    "call out anything that could fail silently or retry forever.",
    "\n\nAlso produce a short migration note for the team, a changelog entry, and a list of "
    "follow-up tasks you would file as issues, each with a one-line rationale.",
]

CHAT = [
    "What is the difference between a process and a thread?",
    "Explain speculative decoding to a product manager in three paragraphs.",
    "Give me a one-week plan to learn the basics of Kubernetes.",
    "How do I politely decline a meeting that has no agenda?",
    "Summarize the causes of the 2008 financial crisis.",
    "What are good habits for writing clear commit messages?",
    "Compare TCP and UDP with two real-world examples each.",
    "How does a GPU differ from a CPU for matrix multiplication?",
    "Write a haiku about a server that never crashes.",
    "What should I check before buying a used car?",
    "Explain the CAP theorem with a simple analogy.",
    "How can a small team run an effective postmortem?",
    "What is the best way to store passwords in a database?",
    "Describe how HTTPS protects a login form.",
    "Give three tips for reducing tail latency in a web service.",
    "How does batching improve inference throughput for language models?",
    "What is the difference between latency and throughput?",
    "Explain what a KV cache is in transformer inference.",
    "How do I estimate the memory needed to serve a 70B parameter model?",
    "What questions should I ask in an on-call handover?",
]
CHAT_STYLES = [
    "{q}",
    "{q} Keep it short.",
    "{q} Please answer in detail, with examples and a summary at the end.",
    "I am new to this topic. {q}",
    "{q} Format the answer as a bulleted list.",
]


def coding_prompts() -> list[dict]:
    rng = random.Random(20261129)
    names = list(SNIPPETS)
    prompts = []
    for t_index, (category, template) in enumerate(TASKS):
        for s_index, name in enumerate(names):
            if (t_index + s_index) % 12 == 11:
                continue  # leave a few combinations out; 220 prompts remain
            lang, code = SNIPPETS[name]
            if category in ("tool-use", "agent-plan") or rng.random() < 0.25:
                extra_name = names[(s_index + 7) % len(names)]
                code = code + "\n\n" + SNIPPETS[extra_name][1] if rng.random() < 0.4 else code
            text = template.format(
                lang=lang, code=code, other=rng.choice([o for o in OTHERS if o != lang]),
                path=f"src/{name.replace('-', '_')}.txt", goal=rng.choice(GOALS),
            ) + rng.choice(EXTRA)
            prompts.append({"prompt": text, "category": category, "language": lang})
    return prompts


def chat_prompts() -> list[dict]:
    return [{"prompt": style.format(q=q), "category": "chat"} for q in CHAT for style in CHAT_STYLES]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, items in (("coding", coding_prompts()), ("chat", chat_prompts())):
        with open(OUT / f"{name}.jsonl", "w") as fh:
            for item in items:
                fh.write(json.dumps(item) + "\n")
        lengths = sorted(len(i["prompt"]) for i in items)
        print(f"{name}: {len(items)} prompts, {lengths[0]}-{lengths[-1]} characters")


if __name__ == "__main__":
    main()
