# Open a page in headless Chromium (Debian's chromium and chromium-driver, driven by Selenium) and
# print, as JSON, what a reader of the page sees: the verification banner, the summary figures,
# each timeline row's cells, facts and file changes, the refusals, the charts' bars, the elements
# that could load something, and every request the page made (the DevTools network log and the
# performance timeline).
import json
import sys
import tempfile

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

page = sys.argv[1]
shot = sys.argv[2] if len(sys.argv) > 2 else None

options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--window-size=1300,1600"):
    options.add_argument(flag)
profile = tempfile.TemporaryDirectory(prefix="chio-browse-")
options.add_argument("--user-data-dir=" + profile.name)
options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
try:
    driver.set_page_load_timeout(30)
    driver.get("file://" + page)
    seen = driver.execute_script(r"""
const text = e => e ? e.textContent.replace(/\s+/g, ' ').trim() : null;
const v = document.getElementById('verification');
const cell = (row, name) => {
  const c = row.querySelector('td.' + name);
  return c ? {text: text(c), value: c.dataset.value === undefined ? null : Number(c.dataset.value)} : null;
};
const rows = [...document.querySelectorAll('#timeline tbody tr')].map(r => ({
  seq: Number(r.dataset.seq), kind: r.classList[0], bad: r.classList.contains('bad'),
  what: text(r.querySelector('td.what summary') || r.querySelector('td.what')),
  cells: Object.fromEntries(['state', 'exit', 'exec', 'wall', 'cpu', 'memory', 'limits', 'changes']
    .map(n => [n, cell(r, n)])),
  facts: [...r.querySelectorAll('li.fact')].map(f => ({name: f.dataset.fact, holds: f.classList.contains('holds')})),
  changes: [...r.querySelectorAll('ul.changes li')].map(c => ({kind: c.className, path: text(c.querySelector('code'))})),
  ids: [...r.querySelectorAll('code.id')].map(text),
}));
const box = v ? v.getBoundingClientRect() : null;
return {
  title: document.title,
  csp: (document.querySelector('meta[http-equiv="Content-Security-Policy"]') || {}).content || null,
  verification: v && {cls: v.className, headline: text(v.querySelector('h1')),
    problems: [...v.querySelectorAll('li')].map(text), top: box.top, height: box.height,
    first: document.body.firstElementChild === v,
    background: getComputedStyle(v).backgroundColor},
  figures: Object.fromEntries([...document.querySelectorAll('#summary dd')].map(d => [d.dataset.figure, text(d)])),
  rows,
  refusals: [...document.querySelectorAll('#refusals li.refusal')].map(f => ({seq: Number(f.dataset.seq),
    text: text(f), reasons: [...f.querySelectorAll('li.reason')].map(text)})),
  bars: Object.fromEntries([...document.querySelectorAll('svg')].map(s => [s.id,
    [...s.querySelectorAll('rect.bar')].map(b => [Number(b.dataset.seq), Number(b.dataset.value), b.getBBox().height])])),
  loaders: Object.fromEntries(['img', 'script', 'iframe', 'link', 'object', 'embed', 'video', 'audio', 'form',
    'base', 'a[href^="http"]'].map(t => [t, document.querySelectorAll(t).length])),
  resources: performance.getEntriesByType('resource').map(e => e.name),
  body_text: document.body.innerText,
};
""")
    if shot:
        driver.save_screenshot(shot)
    # The browser's own start page loads chrome:// resources of its own: the page's requests
    # are those of its document, and no request of any document may leave for the network.
    requests, network = [], []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if message["params"].get("documentURL") == "file://" + page:
                requests.append(url)
            if not url.startswith(("chrome:", "file:", "data:", "about:")):
                network.append(url)
    seen["requests"] = requests
    seen["network"] = network
    print(json.dumps(seen))
finally:
    driver.quit()
