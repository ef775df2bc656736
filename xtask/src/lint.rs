pub fn run(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("lint: not written yet")
}
