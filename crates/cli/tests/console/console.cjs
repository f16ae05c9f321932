// The console in Chromium, as a person works it. crates/cli/tests/console.rs
// makes the data and runs this with CONSOLE_TEST (the ids and texts, as
// JSON) and NODE_PATH (where playwright-core is). Exits non-zero on the
// first thing that is not as it should be.
"use strict";

const assert = require("node:assert/strict");
const path = require("node:path");
const { chromium } = require("playwright-core");

const t = JSON.parse(process.env.CONSOLE_TEST);
const at = (route) => t.base + route;
const LAPTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };

async function shot(page, name) {
  await page.screenshot({ path: path.join(t.shots, `${name}.png`), fullPage: true });
}

// Reloads `page` until `check` holds, for at most `seconds`.
async function until(page, what, check, seconds = 20) {
  const end = Date.now() + seconds * 1000;
  for (;;) {
    if (await check()) return;
    if (Date.now() > end) throw new Error(`never: ${what} (at ${page.url()})`);
    await page.waitForTimeout(300);
    await page.reload();
  }
}

async function signIn(page, token = t.token) {
  await page.goto(at("/console"));
  assert.match(page.url(), /\/console\/login$/, "signed out, the console asks for a token");
  await page.getByLabel("Token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL(at("/console"));
}

function ticket(page, id) {
  return page.locator(`article.ticket[aria-labelledby="q-${id}"]`);
}

async function withJavaScript(browser) {
  const context = await browser.newContext({ viewport: LAPTOP });
  const page = await context.newPage();
  const dialogs = [];
  page.on("dialog", async (dialog) => {
    dialogs.push(dialog.message());
    await dialog.dismiss();
  });
  const errors = [];
  page.on("pageerror", (error) => errors.push(String(error)));

  // A wrong token is refused, saying so.
  await page.goto(at("/console/login"));
  await page.getByLabel("Token").fill("tf_not_a_token");
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByText("That token is not known here").waitFor();
  await shot(page, "login-laptop");

  await signIn(page);
  await shot(page, "front-laptop");
  const cookies = await context.cookies();
  const session = cookies.find((c) => c.name === "toolfleet_console");
  assert.ok(session, "a session cookie");
  assert.equal(session.httpOnly, true);
  assert.equal(session.sameSite, "Strict");

  // The inbox: the run's question, the plans, the payload shown as text.
  await page.getByRole("navigation").getByRole("link", { name: "Inbox" }).click();
  await ticket(page, t.runTicket).waitFor();
  await page.getByText(t.xss, { exact: true }).waitFor();
  assert.equal(await page.locator("main img").count(), 0, "the payload made no element");
  for (const other of [t.bobsQuestion, t.mallorysQuestion]) {
    assert.equal(await page.getByText(other).count(), 0, `${other} is not alice's`);
  }
  await shot(page, "inbox-laptop");

  // A ticket raised while the inbox is open appears without a reload.
  await page.evaluate(() => {
    window.stillThisDocument = true;
  });
  const raised = await fetch(at("/v1/calls"), {
    method: "POST",
    headers: { authorization: `Bearer ${t.token}`, "content-type": "application/json" },
    body: JSON.stringify({ tool: "ask_user", args: { question: "A question that arrives live" } }),
  }).then((r) => r.json());
  assert.equal(raised.status, "suspended", JSON.stringify(raised));
  await page.getByText("A question that arrives live").waitFor({ timeout: 10000 });
  assert.equal(await page.evaluate(() => window.stillThisDocument), true, "the page was not reloaded");

  // Answer the run's question with the keyboard alone: the run resumes
  // and answers. The first stop of Tab is the skip link.
  await page.goto(at("/console/inbox"));
  await page.keyboard.press("Tab");
  assert.equal(await page.evaluate(() => document.activeElement.textContent), "Skip to the content");
  const travel = ticket(page, t.runTicket).getByRole("button", { name: "travel" });
  let reached = false;
  for (let presses = 0; presses < 60 && !reached; presses++) {
    await page.keyboard.press("Tab");
    reached = await travel.evaluate((button) => button === document.activeElement);
  }
  assert.ok(reached, "the answer's button is reached with Tab");
  await page.keyboard.press("Enter");
  await page.getByRole("status").getByText("Answered.").waitFor();
  assert.equal(await ticket(page, t.runTicket).count(), 0, "answered, it leaves the open tickets");

  // Approve one plan; reject the other with a reason.
  await ticket(page, t.approve).getByRole("button", { name: "Approve" }).click();
  await page.getByRole("status").getByText("Approved.").waitFor();
  const rejecting = ticket(page, t.reject);
  await rejecting.getByLabel("Reason for rejecting (optional)").fill("Not this month.");
  await rejecting.getByRole("button", { name: "Reject" }).click();
  await page.getByRole("status").getByText("Rejected.").waitFor();

  // The run, resumed, answers; its transcript shows the question.
  await page.goto(at(`/console/runs/${t.run}`));
  await until(page, "the run answers", async () =>
    (await page.getByText("Filed exp-007 as travel.").count()) > 0,
  );
  await page.getByText(t.question).first().waitFor();
  await shot(page, "run-laptop");
  await page.goto(at("/console/runs"));
  await shot(page, "runs-laptop");

  // A run's page is live: its ticket answered elsewhere, it resumes on
  // the page without a reload; then it is cancelled from the page.
  await page.goto(at(`/console/runs/${t.driven}`));
  await page.locator(".state.waiting").waitFor();
  await page.evaluate(() => {
    window.stillThisDocument = true;
  });
  const answered = await fetch(at(`/v1/tickets/${t.drivenTicket}/answer`), {
    method: "POST",
    headers: { authorization: `Bearer ${t.token}`, "content-type": "application/json" },
    body: JSON.stringify({ answer: "yes" }),
  }).then((r) => r.json());
  assert.equal(answered.status, "ok", JSON.stringify(answered));
  await page.locator(".state.running").waitFor({ timeout: 10000 });
  assert.equal(await page.evaluate(() => window.stillThisDocument), true, "the run page was not reloaded");
  await page.getByRole("button", { name: "Cancel the run" }).click();
  await page.getByRole("status").getByText("Cancelled.").waitFor();
  await page.locator(".state.cancelled").waitFor();

  // The failed job, one click from the front page: retried, it succeeds.
  await page.goto(at("/console"));
  await page.getByRole("link", { name: /failed jobs/ }).click();
  await page.waitForURL(/state=failed/);
  assert.equal(await page.getByText(t.bobsJob).count(), 0, "bob's job is not listed");
  assert.equal(await page.getByText(t.mallorysJob).count(), 0, "another tenant's job is not listed");
  await shot(page, "jobs-laptop");
  // A time window: the jobs made in a window that holds none list none.
  await page.getByLabel("Made from (UTC)").fill("2001-01-01T00:00");
  await page.getByLabel("Made before (UTC)").fill("2001-01-02T00:00");
  await page.getByRole("button", { name: "Show" }).click();
  await page.getByText("No job matches").waitFor();
  await page.goto(at("/console/jobs?state=failed&from=2001-01-01T00:00"));
  await page.getByRole("link", { name: t.failed }).waitFor();
  await page.getByRole("link", { name: t.failed }).click();
  await page.getByText("the ledger is locked").first().waitFor();
  const logged = page.locator("table.attempts tbody tr");
  assert.equal(await logged.count(), 1, "its one failed attempt, with its times and error");
  assert.match(await logged.first().textContent(), /tool_failed/);
  await page.getByRole("button", { name: "Retry" }).click();
  await page.getByRole("status").getByText("Put back").waitFor();
  await until(page, "the retried job succeeds", async () =>
    (await page.locator(".state.succeeded").count()) > 0,
  );
  await page.getByText('"filed"').waitFor();
  await page.getByRole("heading", { name: "Arguments" }).waitFor();
  await page.getByText('"2026-09"').waitFor();
  assert.equal(await page.getByText("k-hunter2").count(), 0, "a redacted argument is not shown");
  await shot(page, "job-laptop");

  // Cancel the running job.
  await page.goto(at(`/console/jobs/${t.slow}`));
  await page.getByRole("button", { name: "Cancel" }).click();
  await page.getByRole("status").getByText("Cancelled.").waitFor();
  await page.locator(".state.cancelled").waitFor();

  // Another user's and another tenant's jobs read as missing.
  for (const other of [t.bobsJob, t.mallorysJob]) {
    await page.goto(at(`/console/jobs/${other}`));
    await page.getByText("No such job for you").waitFor();
    assert.equal(await page.getByRole("button", { name: "Retry" }).count(), 0);
  }

  // A notice from a link elsewhere is not shown: only what the console signed.
  await page.goto(at("/console/inbox?error=Your%20session%20expired%2C%20paste%20your%20token%20at%20evil.example"));
  assert.equal(await page.getByText("evil.example").count(), 0, "an unsigned notice");
  // A sign-in posted from another site is refused.
  const foreign = await context.request.post(at("/console/login"), {
    form: { token: t.token },
    headers: { origin: "https://evil.example" },
    maxRedirects: 0,
  });
  assert.equal(foreign.status(), 403, "a sign-in from another site");

  // A form post without the CSRF token, or with another's, is refused.
  for (const form of [{}, { csrf: "00" }]) {
    const refused = await context.request.post(at(`/console/jobs/${t.slow}/retry`), {
      form,
      maxRedirects: 0,
    });
    assert.equal(refused.status(), 403, "a post without its CSRF token");
  }
  const headers = (await context.request.get(at("/console/inbox"))).headers();
  assert.match(headers["content-security-policy"], /default-src 'none'/);
  assert.match(headers["content-security-policy"], /script-src 'self'/);

  // The queues are for operators: alice is told so.
  await page.goto(at("/console/queues"));
  await page.getByText("The queues are for your tenant's operators").waitFor();

  await page.goto(at("/console/tools"));
  await page.getByRole("heading", { name: "file_report" }).waitFor();
  await shot(page, "tools-laptop");

  // The same pages at a phone's width.
  const phone = await browser.newContext({ viewport: PHONE, storageState: await context.storageState() });
  const small = await phone.newPage();
  for (const [name, route] of [
    ["front", "/console"],
    ["inbox", "/console/inbox"],
    ["jobs", "/console/jobs"],
    ["job", `/console/jobs/${t.failed}`],
    ["runs", "/console/runs"],
    ["queues", "/console/queues"],
    ["run", `/console/runs/${t.run}`],
    ["tools", "/console/tools"],
  ]) {
    await small.goto(at(route));
    await shot(small, `${name}-phone`);
    const wide = await small.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(wide <= PHONE.width + 1, `${name} fits a phone's width (${wide} px)`);
  }
  await phone.close();

  assert.deepEqual(dialogs, [], "no script ran from what people or models wrote");
  assert.deepEqual(errors, [], "the console's script raised nothing");
  await context.close();
}

// An operator's queues: the tenant's pools, what waits and what settled.
async function asOperator(browser) {
  const context = await browser.newContext({ viewport: LAPTOP });
  const page = await context.newPage();
  await signIn(page, t.operatorToken);
  await page.getByRole("navigation").getByRole("link", { name: "Queues" }).click();
  const row = page.locator("tbody tr", { has: page.locator("code", { hasText: /^default$/ }) });
  await row.waitFor();
  const cells = await row.locator("td").allTextContents();
  assert.ok(Number(cells[3]) >= 0, `running: ${cells}`);
  assert.ok(Number(cells[6]) >= 1, `something succeeded in the hour: ${cells}`);
  assert.ok(Number(cells[7]) >= 1, `something failed in the hour: ${cells}`);
  assert.match(cells[8], /\d+(\.\d)? (ms|s|min) \/ \d+(\.\d)? (ms|s|min)/, `the wait: ${cells}`);
  await row.locator("svg rect").first().waitFor();
  await row.locator("svg.wait rect").first().waitFor();
  await shot(page, "queues-laptop");
  // An operator sees every user's failed jobs of the tenant, never another tenant's.
  await page.goto(at("/console/jobs?state=failed"));
  await page.getByText(t.bobsJob).waitFor();
  assert.equal(await page.getByText(t.mallorysJob).count(), 0);
  await context.close();
}

// The inbox with JavaScript off: plain form posts.
async function withoutJavaScript(browser) {
  const context = await browser.newContext({ viewport: LAPTOP, javaScriptEnabled: false });
  const page = await context.newPage();
  await signIn(page);
  await page.goto(at("/console/inbox"));
  const typed = ticket(page, t.typedTicket);
  await typed.getByLabel("Your answer").fill("Project Spree");
  await typed.getByRole("button", { name: "Answer" }).click();
  await page.getByRole("status").getByText("Answered.").waitFor();
  assert.equal(await ticket(page, t.typedTicket).count(), 0);
  await shot(page, "inbox-no-javascript");
  // Signing out ends the session.
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.waitForURL(/\/console\/login$/);
  await page.goto(at("/console/inbox"));
  assert.match(page.url(), /\/console\/login$/);
  await context.close();
}

(async () => {
  const browser = await chromium.launch({
    executablePath: t.chromium,
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  try {
    await withJavaScript(browser);
    await asOperator(browser);
    await withoutJavaScript(browser);
  } finally {
    await browser.close();
  }
  console.log(`console: every step held; screenshots in ${t.shots}`);
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
