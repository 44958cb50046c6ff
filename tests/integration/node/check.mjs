// The checks the client scripts share: each prints "ok" or "FAIL" with what
// it saw; failed() is the count, for the exit status.
let failures = 0;

export function check(cond, what, detail) {
  if (!cond) {
    failures++;
    console.error(`FAIL ${what}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
  } else {
    console.log(`ok   ${what}`);
  }
}

export function failed() {
  return failures;
}
